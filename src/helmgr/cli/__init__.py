"""The `helmgr` command. Every command documents its options in `--help`.

Exit codes: 0 ok; 2 bad input, with one line on stderr naming the bad value; 1 an
internal error (with its traceback, since it is a bug).
"""
from __future__ import annotations

import sys

import click

from helmgr.cli.bench_cmd import bench_cmd
from helmgr.cli.calibrate_cmd import calibrate_cmd
from helmgr.cli.capacity_cmd import capacity_cmd
from helmgr.cli.compare_cmd import compare_cmd
from helmgr.cli.evaluate_cmd import evaluate_cmd
from helmgr.cli.history_cmd import history
from helmgr.cli.model_cmd import model
from helmgr.cli.notuning_cmd import notuning_cmd
from helmgr.cli.plan_cmd import plan_cmd
from helmgr.cli.profile_cmd import profile
from helmgr.cli.scenario_cmd import scenario_cmd
from helmgr.cli.serve_cmd import loadgen_cmd, serve_cmd
from helmgr.cli.simulate_cmd import simulate_cmd
from helmgr.cli.sweep_cmd import sweep_cmd
from helmgr.cli.train_cmd import train_cmd
from helmgr.cli.workload_cmd import workload
from helmgr.core.errors import HelmInputError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="helmgr")
def cli() -> None:
    """HELM: adaptive EMB/KV memory split and cache-aware routing for generative recommenders."""


cli.add_command(simulate_cmd)
cli.add_command(compare_cmd)
cli.add_command(sweep_cmd)
cli.add_command(scenario_cmd)
cli.add_command(evaluate_cmd)
cli.add_command(notuning_cmd)
cli.add_command(capacity_cmd)
cli.add_command(plan_cmd)
cli.add_command(workload)
cli.add_command(history)
cli.add_command(model)
cli.add_command(profile)
cli.add_command(bench_cmd)
cli.add_command(train_cmd)
cli.add_command(calibrate_cmd)
cli.add_command(serve_cmd)
cli.add_command(loadgen_cmd)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="helmgr", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        print("helmgr: aborted", file=sys.stderr)
        return 130
    except click.UsageError as exc:
        print(f"helmgr: error: {exc.format_message()}", file=sys.stderr)
        return 2
    except HelmInputError as exc:
        print(f"helmgr: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
