import math
from pathlib import Path

import numpy as np
import pytest

from helmgr.controller import Controller, WindowStats
from helmgr.controller.detect import BurstDetector
from helmgr.learn.env import HelmEnv
from helmgr.controller.mlp import MLPPolicy
from helmgr.controller.layout import N_FEATURES_V1
from helmgr.controller.observe import N_FEATURES, Observer, reward
from helmgr.controller.safety import Safety
from tests.controller_reference import ReferenceController

TINY = dict(episode_s=4.0, warmup_s=2.0, rps_per_node=80.0, users_per_node=4000,
            workload={"n_items": 20_000, "n_clusters": 8, "duration_s": 8.0})   # runs of 8 s: an episode
                                                                                         # starts in its first second


def constant_policy(value: float, max_step: float = 0.02) -> MLPPolicy:
    """A one-layer 'network' whose action is `value` whatever it sees."""
    return MLPPolicy([np.zeros((1, N_FEATURES))], [np.array([value])], np.zeros(N_FEATURES), np.ones(N_FEATURES),
                     max_step=max_step)


def stepper(fast: bool, ctl: Controller):
    """The compiled controller, or its slow reference (tests/controller_reference.py) on the same
    configuration."""
    return ctl if fast else ReferenceController(ctl)


def stats(ratio=0.5, rps=300.0, p99=0.01, emb=0.9, kv=0.8):
    return WindowStats(ratio=ratio, arrival_rps=rps, p99_s=p99, slo_s=0.03, emb_hit_rate=emb, kv_hit_rate=kv)


def test_env_is_seeded_and_passes_check_env():
    from stable_baselines3.common.env_checker import check_env
    check_env(HelmEnv(**TINY))
    runs = []
    for _ in range(2):
        env = HelmEnv(**TINY)
        obs, info = env.reset(seed=11)
        trace = [obs]
        for a in (0.5, -1.0, 1.0, 0.0):
            obs, r, done, trunc, info = env.step(np.array([a], np.float32))
            trace += [obs, np.array([r])]
        runs.append(np.concatenate(trace))
    assert np.array_equal(runs[0], runs[1]) and done
    assert not np.array_equal(HelmEnv(**TINY).reset(seed=12)[0], runs[0][:N_FEATURES])   # another seed, another episode


@pytest.mark.parametrize("relative", [False, True])
def test_env_episodes_are_the_same_on_either_simulator_path(relative):
    """The environment runs its cluster (and its twin, a fork taken mid-run) on the compiled path:
    observations and rewards are the Python path's, step for step."""
    traces = {}
    for path in ("python", "auto"):
        env = HelmEnv(**(TINY | dict(relative=relative, sim_path=path, regimes=("burst",))))
        obs, _ = env.reset(seed=5)
        trace = [obs]
        for a in (1.0, -0.5, 0.25, -1.0):
            obs, r, *_ = env.step(np.array([a], np.float32))
            trace += [obs, np.array([r])]
        traces[path] = np.concatenate(trace)
        assert env.cluster.path == ("python" if path == "python" else "compiled")
    np.testing.assert_array_equal(traces["auto"], traces["python"])


def test_env_episodes_are_stretches_of_the_default_runs_on_its_nodes():
    """A node's share of the default cluster (an eighth of the regime's rate and users), pipelined
    batches of 8, the 20-ms SLO, a random stretch of the whole 360-s run; the presets drawn from
    the mixture."""
    from helmgr.workload import default_config
    small = dict(n_items=20_000, n_clusters=8)
    env = HelmEnv(regimes=("trend",), episode_s=3.0, warmup_s=2.0, workload=small,
                  hardware=("a100-80g", "h100-80g"), model=("large", "small"))
    drawn = set()
    for seed in range(8):
        _, info = env.reset(seed=seed)
        c, wc = env.cluster.cfg, env.workload_config
        assert (c.engine, c.max_batch, c.slo_ms, env.slo_s) == ("pipelined", 8, 20.0, 0.02)
        assert wc.rps == default_config("trend").rps / 8 == 275.0 and wc.duration_s == 360.0
        assert wc.n_users == default_config("trend").n_users // 8
        assert 0 <= info["start_s"] <= 360 - 2 - 3 - 1 and (c.hardware, c.model) == (info["hardware"], info["model"])
        drawn.add((info["hardware"], info["model"]))
    assert {h for h, _ in drawn} == {"a100-80g", "h100-80g"} and {m for _, m in drawn} == {"large", "small"}
    # the stretch: the stream from start_s on, moved to 0
    env = HelmEnv(regimes=("steady",), episode_s=3.0, warmup_s=2.0, workload=small)
    _, info = env.reset(seed=3)
    start = info["start_s"]
    w = env.cluster.workload
    first = next(c for k, c in enumerate(w.chunks(1.0)) if k == start + 2)
    mine = next(env.chunks)
    assert start > 0 and np.array_equal(mine.t, first.t - start) and np.array_equal(mine.user, first.user)


def test_the_recorded_train_command_names_every_setting_off_its_default():
    from helmgr.learn.train import command_flags
    assert command_flags({}) == ""
    assert command_flags({"regimes": ("steady", "trend", "burst"), "episode_s": 60.0, "relative": True,
                          "hardware": ("a100-80g",), "model": ("large", "small")}) == \
        " --episode-s 60 --model large,small --relative"
    assert command_flags({"regimes": ("burst",), "hardware": "h100-80g"}) == " --workloads burst --hardware h100-80g"


def test_exported_policy_matches_the_trained_one():
    from helmgr.learn.train import export, make_model
    model, venv = make_model(TINY, seed=3, n_steps=32)
    model.learn(total_timesteps=64)
    p = export(model, venv, max_step=0.05)
    rng = np.random.default_rng(0)
    for _ in range(50):
        raw = rng.normal(0, 2, N_FEATURES).astype(np.float32)
        a, _ = model.predict(venv.normalize_obs(raw[None]), deterministic=True)
        assert p.action(raw) == pytest.approx(float(a[0][0]), abs=1e-5)


def test_a_warm_start_decides_as_the_file_and_is_held_while_the_critic_learns(tmp_path, monkeypatch):
    from helmgr.learn import train as T
    rng = np.random.default_rng(5)
    ws = [rng.normal(0, 0.3, (64, N_FEATURES_V1)), rng.normal(0, 0.3, (64, 64)), rng.normal(0, 0.3, (1, 64))]
    bs = [rng.normal(0, 0.1, 64), rng.normal(0, 0.1, 64), rng.normal(0, 0.1, 1)]
    old = MLPPolicy(ws, bs, rng.normal(0, 1, N_FEATURES_V1), rng.uniform(0.5, 2, N_FEATURES_V1), max_step=0.05)
    model, venv = T.make_model(TINY, seed=3, n_steps=32)
    assert T.warm_start(model, venv, old, TINY, seed=3) == N_FEATURES - N_FEATURES_V1
    p = T.export(model, venv, max_step=0.05)
    assert p.obs_mean[:N_FEATURES_V1].tolist() == old.obs_mean.tolist()
    assert venv.obs_rms.count == T.INIT_COUNT
    for _ in range(20):                                # the widened input is read with zero weight
        raw = rng.normal(0, 2, N_FEATURES)
        assert p.action(raw) == pytest.approx(old.action(raw[:N_FEATURES_V1]), abs=1e-6)
        a, _ = model.predict(venv.normalize_obs(raw[None].astype(np.float32)), deterministic=True)
        assert float(a[0][0]) == pytest.approx(old.action(raw[:N_FEATURES_V1]), abs=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        T.warm_start(model, venv, constant_policy(0.0), TINY, seed=3)
    # trained from the file for fewer steps than the hold: the actor is the file's, the critic moved
    path = tmp_path / "old.npz"
    old.save(path)
    monkeypatch.setattr(T, "INIT_CRITIC_STEPS", 10**6)
    made = {}
    real = T.make_model
    monkeypatch.setattr(T, "make_model", lambda *a, **k: made.setdefault("m", real(*a, **k)))
    T.train(64, 4, tmp_path / "new.npz", tmp_path / "runs", TINY, init=path, n_steps=32)
    new = MLPPolicy.load(tmp_path / "new.npz")
    f32 = [w.astype(np.float32).astype(np.float64) for w in ws]      # torch holds float32
    assert np.array_equal(new.w[0][:, :N_FEATURES_V1], f32[0]) and not new.w[0][:, N_FEATURES_V1:].any()
    assert np.array_equal(new.w[2], f32[2]) and new.meta["init"]["file"] == "old.npz"
    critic = made["m"][0].policy.mlp_extractor.value_net[0].weight.detach().numpy()
    fresh = real(TINY, seed=4, n_steps=32)[0].policy.mlp_extractor.value_net[0].weight.detach().numpy()
    assert not np.allclose(critic, fresh)


def test_nodes_vec_env_gives_each_node_its_own_action_observation_and_pay():
    from helmgr.learn.vec import NodesVecEnv
    venv = NodesVecEnv(**(TINY | dict(nodes=2, relative=True, workload={"n_items": 20_000, "n_clusters": 8})))
    venv.seed(7)
    obs = venv.reset()
    env = venv.env
    assert obs.shape == (2, N_FEATURES) and obs.dtype == np.float32
    start = [n.ratio for n in env.cluster.nodes]
    assert start[0] == start[1] and obs[0][0] == pytest.approx(start[0])
    venv.step_async(np.array([[1.0], [-1.0]]))
    obs, pay, done, infos = venv.step_wait()
    after = [n.ratio for n in env.cluster.nodes]
    assert after == pytest.approx([start[0] + env.max_step, start[1] - env.max_step])
    assert obs[:, 0] == pytest.approx(after) and not done.any()
    for i in range(2):                         # each node's own reward, less its twin's held at the start
        twin = WindowStats.from_window(env.twin.policy.windows[i], env.slo_s)
        assert pay[i] == pytest.approx(reward(env.node_stats[i], after[i] - start[i]) - reward(twin, 0.0))
    assert pay[0] != pay[1]
    first = None
    for _ in range(int(TINY["episode_s"]) - 1):
        venv.step_async(np.zeros((2, 1)))
        obs, pay, done, infos = venv.step_wait()
        first = env.first_obs
    assert done.all() and all("terminal_observation" in i for i in infos)
    assert np.array_equal(obs, first) and env.t == TINY["warmup_s"]      # the next episode, begun


def test_training_on_a_cluster_of_nodes_runs_and_exports():
    from helmgr.learn.train import export, make_model
    model, venv = make_model(TINY | dict(nodes=2), seed=3, n_steps=16)
    assert venv.num_envs == 2
    model.learn(total_timesteps=64)
    p = export(model, venv, max_step=0.05)
    raw = np.random.default_rng(0).normal(0, 2, N_FEATURES).astype(np.float32)
    a, _ = model.predict(venv.normalize_obs(raw[None]), deterministic=True)
    assert p.action(raw) == pytest.approx(float(a[0][0]), abs=1e-5)
    with pytest.raises(ValueError, match="one environment of 2"):
        make_model(TINY | dict(nodes=2), seed=3, n_envs=2)


def test_checkpoints_are_the_policy_as_trained_so_far(tmp_path):
    from helmgr.learn.train import train
    kw = TINY | dict(nodes=2)                 # 2 transitions a step, rollouts of 32 transitions
    done = train(96, 3, tmp_path / "p.npz", tmp_path / "runs", kw, n_steps=32, checkpoint_every=40)
    assert [Path(c).name for c in done["checkpoints"]] == ["checkpoint-40.npz", "checkpoint-80.npz"]
    at = {n: MLPPolicy.load(Path(c)) for n, c in zip((40, 80), done["checkpoints"])}
    assert at[40].meta["checkpoint"] == 40 and at[40].meta["seed"] == 3
    # at 40 transitions PPO has updated once (after the first rollout): the actor of a run of one rollout
    one = train(32, 3, tmp_path / "one.npz", tmp_path / "runs", kw, n_steps=32)
    first = MLPPolicy.load(Path(one["out"]))
    final = MLPPolicy.load(tmp_path / "p.npz")
    assert all(np.array_equal(a, b) for a, b in zip(at[40].w, first.w))
    assert not np.array_equal(at[80].w[0], at[40].w[0]) and not np.array_equal(final.w[0], at[80].w[0])
    assert "checkpoint" not in final.meta


def test_target_kl_stops_an_updates_epochs():
    from helmgr.learn.train import make_model
    free, _ = make_model(TINY, seed=3, n_steps=32)
    held, _ = make_model(TINY, seed=3, n_steps=32, target_kl=1e-9)      # any step passes 1.5 x this
    assert free.target_kl is None and held.target_kl == 1e-9
    for m in (free, held):
        m.learn(total_timesteps=32)
    # SB3's n_updates counts epochs (one batch of 32 each): all 10, or two, as the first batch of an
    # epoch measures KL 0 (nothing moved yet) and the second epoch's first batch is past the target
    assert free._n_updates == 10 and held._n_updates == 2


def test_base_policy_step_and_safety():
    ctl = Controller(constant_policy(1.0, max_step=0.02), safety=Safety(max_slew=0.1))   # no min_move
    assert ctl.step(stats(0.5)) == pytest.approx(0.52)
    assert ctl.step(stats(0.52)) == pytest.approx(0.54)
    assert len(ctl.latency_ns) == 2 and min(ctl.latency_ns) > 0
    nan = Controller(constant_policy(math.nan))
    assert nan.step(stats(0.4)) == 0.4 and nan.safety.non_finite == 1


def test_the_ratio_moves_only_in_steps_of_min_move():
    """A base policy stepping +0.02 a window under the default min_move 0.03: the target walks
    0.52, 0.54, 0.56, 0.58, 0.60; the node's ratio stays at 0.50 until the target is 0.04 away, then
    follows it: 0.50, 0.54, 0.54, 0.58, 0.58. The compiled controller and its reference agree; the
    move cost in the adapter's reward is the move made."""
    for fast in (True, False):
        ctl = stepper(fast, Controller(constant_policy(1.0, max_step=0.02)))
        ratio, ratios = 0.5, []
        for _ in range(5):
            ratio = ctl.step(stats(ratio))
            ratios.append(ratio)
        assert ratios == pytest.approx([0.50, 0.54, 0.54, 0.58, 0.58], abs=1e-12)
        assert ctl.target == pytest.approx(0.60, abs=1e-12) and ctl.safety.settled == 3
        assert ctl.moved == 0.0


def test_the_slew_limit_holds_for_the_ratio_set_under_the_hysteresis():
    """+0.029 a window, slew 0.05, min_move 0.03: the target 0.529 is not moved to; next window the
    plan is 0.558 but the ratio set moves 0.05 from 0.50, to 0.55 (a slew counted from the target
    would have let it jump 0.058)."""
    for fast in (True, False):
        ctl = stepper(fast, Controller(constant_policy(1.0, max_step=0.029),
                                       safety=Safety(max_slew=0.05, min_move=0.03)))
        ratio, ratios = 0.5, [0.5]
        for _ in range(6):
            ratio = ctl.step(stats(ratio))
            ratios.append(ratio)
        assert ratios[1:3] == pytest.approx([0.50, 0.55], abs=1e-12)
        assert max(np.abs(np.diff(ratios))) <= 0.05 + 1e-12 and ctl.safety.slewed >= 1


def test_zero_adapter_changes_nothing_until_it_learns():
    from helmgr.controller.adapter import MarginalAdapter
    ctl = Controller(constant_policy(0.5, max_step=0.02), adapter=MarginalAdapter())
    plain = Controller(constant_policy(0.5, max_step=0.02))
    for k in range(5):
        assert ctl.step(stats(0.3 + 0.01 * k)) == plain.step(stats(0.3 + 0.01 * k))


def test_recovery_tier_takes_over_in_a_burst_and_hands_back():
    ctl = Controller(constant_policy(-1.0, max_step=0.02), detector=BurstDetector(3, exit_ticks=5, warmup_ticks=20),
                     recovery_ratio=0.85, recovery_step=0.1, safety=Safety(max_slew=0.1))   # every step moves
    rng = np.random.default_rng(0)
    ratios = []
    for w in range(80):
        burst = 30 <= w < 40
        s = stats(ratio=ratios[-1] if ratios else 0.6, rps=(1200.0 if burst else 300.0) + rng.normal(0, 10),
                  emb=0.9 + rng.normal(0, 0.005), kv=0.8 + rng.normal(0, 0.005))
        ratios.append(ctl.step(s))
    assert [e for _, e in ctl.events] == ["start", "end"]
    start, end = (w for w, _ in ctl.events)
    assert start == 30 and 40 <= end <= 46
    assert ratios[29] == pytest.approx(0.05)                  # the base policy pushed it to r_min
    assert ratios[30] == pytest.approx(0.15) and ratios[33] == pytest.approx(0.45)   # steered up, 0.1 a window
    assert ratios[end] < ratios[end - 1]                       # handed back: the base policy again


def test_recovery_grows_the_emb_cache_only_while_it_misses():
    """The burst above on a node whose EMB cache already holds nearly everything (hit rate 0.995,
    as on H200): recovery starts and ends as before but leaves the plan where the base put it
    (r_min, 0.05); a miss rate of 0.02 (> recovery_miss 0.01) steers it up 0.1 a window. A plan
    above the recovery target still comes down to it. The compiled controller and its reference agree."""
    for fast in (True, False):
        for emb, start in ((0.995, 0.05), (0.98, 0.05), (0.995, 0.95)):
            ctl = Controller(constant_policy(-1.0 if start < 0.5 else 0.0, max_step=0.02), safety=Safety(max_slew=0.1),
                             detector=BurstDetector(3, exit_ticks=5, warmup_ticks=20), recovery_ratio=0.85)
            ctl = stepper(fast, ctl)
            ratios = []
            for w in range(40):
                s = stats(ratio=ratios[-1] if ratios else start, rps=1200.0 if w >= 30 else 300.0 + w % 3, emb=emb)
                ratios.append(ctl.step(s))
            assert [e for _, e in ctl.events] == ["start"] and ctl.events[0][0] == 30
            expected = {(0.995, 0.05): 0.05, (0.98, 0.05): 0.45, (0.995, 0.95): 0.85}[emb, start]
            assert ratios[33] == pytest.approx(expected)


def test_recovery_holds_until_the_backlog_has_drained():
    """The burst is over at window 40 but the node stays over its SLO until window 60: recovery
    hands back only then (the compiled controller and its reference agree)."""
    for fast in (True, False):
        ctl = stepper(fast, Controller(constant_policy(-1.0),
                                       detector=BurstDetector(3, exit_ticks=5, warmup_ticks=20)))
        rng = np.random.default_rng(0)
        ratio = 0.6
        for w in range(80):
            s = stats(ratio=ratio, rps=(1200.0 if 30 <= w < 40 else 300.0) + rng.normal(0, 10),
                      p99=0.3 if 30 <= w < 60 else 0.01, emb=0.9 + rng.normal(0, 0.005), kv=0.8 + rng.normal(0, 0.005))
            ratio = ctl.step(s)
        assert ctl.events == [(30, "start"), (60, "end")]


@pytest.mark.parametrize("hold", [0.0, 40.0])
def test_after_a_burst_the_ratio_decays_no_faster_than_the_hold(hold):
    """A base policy that pulls the plan down 0.03 a window: without a hold the ratio falls 0.03 a
    window from the hand-back; with a 40-window hold the floor falls (0.85 - 0.05) / 40 = 0.02 a
    window and the plan rides it. The compiled controller and its reference agree."""
    for fast in (True, False):
        ctl = Controller(constant_policy(-1.0, max_step=0.03), detector=BurstDetector(3, exit_ticks=5, warmup_ticks=20),
                         recovery_ratio=0.85, recovery_step=0.1, recovery_hold=hold, safety=Safety(max_slew=0.1))
        ctl = stepper(fast, ctl)
        rng = np.random.default_rng(0)
        ratios = []
        for w in range(70):
            s = stats(ratio=ratios[-1] if ratios else 0.6, rps=(1200.0 if 30 <= w < 40 else 300.0) + rng.normal(0, 10),
                      emb=0.9 + rng.normal(0, 0.005), kv=0.8 + rng.normal(0, 0.005))
            ratios.append(ctl.step(s))
        end = ctl.events[1][0]
        assert ratios[end - 1] == pytest.approx(0.85)
        fall = 0.02 if hold else 0.03
        assert ratios[end:end + 20] == pytest.approx([0.85 - fall * (k + 1) for k in range(20)], abs=1e-12)
        assert (ctl.hold is not None) == bool(hold)


def test_recovery_steps_down_when_the_samples_mean_is_clearly_negative():
    """A base that holds (action 0) at 0.6; a burst from window 30; EMB misses 0.1, so the miss
    rule climbs 0.1 a window to the recovery ratio: 0.7, 0.8, 0.85. The sample at window 31 is
    dropped by the move that follows it (taken at another split). Samples -1.0, -1.2, -0.8 at
    windows 33-37: n = 3, mean -1.0, standard error 0.2/sqrt(3) = 0.115 < 1.0/2.5, so at 37 the
    plan steps 0.05 down to 0.80 and the miss rule is off. (Kept, the -5.0 would leave the mean
    -2.0 within 2.5 errors of zero: no step.) Then -0.2, +0.3, -0.25, +0.35 (mean 0.05): no step;
    +1.0, +1.1, +0.9 would never step up. With `recovery_signal=0` the miss rule holds 0.85. The
    compiled controller and its reference agree."""
    signs = {31: -5.0, 33: -1.0, 35: -1.2, 37: -0.8, 39: -0.2, 41: 0.3, 43: -0.25, 45: 0.35,
             47: 1.0, 49: 1.1, 51: 0.9}
    climb = [0.7, 0.8] + [0.85] * 5
    for fast in (True, False):
        for step, expected in ((0.05, climb + [0.8] * 16), (0.0, climb + [0.85] * 16)):
            ctl = Controller(constant_policy(0.0), detector=BurstDetector(3, exit_ticks=5, warmup_ticks=20),
                             recovery_ratio=0.85, recovery_step=0.1, recovery_signal=step, safety=Safety(max_slew=0.1))
            ctl = stepper(fast, ctl)
            ratios = []
            for w in range(53):
                s = stats(ratio=ratios[-1] if ratios else 0.6, rps=1200.0 if w >= 30 else 300.0 + w % 3, emb=0.9)
                ratios.append(ctl.step(s, signs.get(w)))
            assert ratios[29] == pytest.approx(0.6)
            assert ratios[30:] == pytest.approx(expected, abs=1e-12), (fast, step)
    with pytest.raises(ValueError, match="recovery_signal"):
        Controller(None, recovery_signal=-0.1)
    with pytest.raises(ValueError, match="recovery_samples"):
        Controller(None, recovery_samples=1)


def test_adapter_is_a_bounded_offset_around_the_plan_never_a_walk():
    """An adapter at its bound (+0.05) with a base that holds: the ratio sits 0.05 above the plan,
    it does not climb 0.05 a window."""
    from helmgr.controller.adapter import MarginalAdapter
    a = MarginalAdapter(bound=0.05, step=0.05, max_step=None)
    a.set(1.0)                                          # clamped to the bound
    assert a.offset == 0.05
    ctl = Controller(constant_policy(0.0), adapter=a)
    ratios = [ctl.step(stats(0.4)) for _ in range(10)]
    assert ratios == pytest.approx([0.45] * 10) and ctl.plan == pytest.approx(0.4)


def pull_policy(target: float, max_step: float = 0.05) -> MLPPolicy:
    """A base that steers the ratio it sees toward `target`: action tanh(-(r - target) / 0.1)."""
    w = np.zeros((1, N_FEATURES))
    w[0, 0] = -1.0
    mean, var = np.zeros(N_FEATURES), np.ones(N_FEATURES)
    mean[0], var[0] = target, 0.01
    return MLPPolicy([w, np.ones((1, 1))], [np.zeros(1), np.zeros(1)], mean, var, max_step=max_step)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_base_does_not_cancel_the_adapters_offset(compiled):
    """A base that steers toward 0.4, an adapter held at +0.05: the node settles at 0.45, the plan
    at 0.4. (When the base read the node's ratio, it saw 0.45, steered the plan to 0.35 and the
    node ended at 0.4: the offset was cancelled.)"""
    from helmgr.controller.adapter import MarginalAdapter
    runs = {}
    for offset in (0.0, 0.05):
        a = MarginalAdapter(hold_base=False)
        a.set(offset)
        ctl = stepper(compiled, Controller(pull_policy(0.4), adapter=a, safety=Safety(max_slew=0.1)))
        ratio = 0.6
        for _ in range(60):
            ratio = ctl.step(stats(ratio))
        runs[offset] = ratio, ctl.plan
    assert runs[0.0] == pytest.approx((0.4, 0.4), abs=1e-6)
    assert runs[0.05] == pytest.approx((0.45, 0.4), abs=1e-6)


def test_observation_and_reward_by_hand():
    ob = Observer()
    o = ob(WindowStats(ratio=0.4, arrival_rps=100.0, p99_s=0.06, slo_s=0.03, queue_len=math.e - 1))
    assert o.tolist() == pytest.approx([0.4, 1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.5, 0.0])
    o = ob(WindowStats(ratio=0.4, arrival_rps=200.0, p99_s=None, slo_s=0.03))
    assert o[3] == pytest.approx(2.0) and o[4] == pytest.approx(1.0) and o[6] == 0.0
    # "marginal_ms": the samples' EWMA (weight 0.5) in ms, held between samples, each clipped to ±10
    s = WindowStats(ratio=0.4, arrival_rps=200.0, p99_s=None, slo_s=0.03)
    assert [ob(s, m)[10] for m in (0.004, None, 0.1, -0.001, math.nan)] == pytest.approx([2.0, 2.0, 6.0, 2.5, 2.5])
    assert reward(WindowStats(0.4, 1.0, 0.06, 0.03), moved=0.05) == pytest.approx(-2.0 - 1.0 - 0.1)


def test_helm_policy_drives_every_node_in_the_simulator(tmp_path):
    from helmgr.sim import SimConfig, simulate
    from helmgr.policy.helm import HelmBase
    from tests.test_sim import small
    constant_policy(1.0, max_step=0.05).save(tmp_path / "up.npz")   # always "more EMB"
    r = simulate(SimConfig(nodes=2, ratio=0.3, router="helm", warmup_s=2.0), small(duration_s=6.0),
                 policy=HelmBase(str(tmp_path / "up.npz")))
    s = r.summary
    assert s["completed"] == s["requests"]
    final = [node.ratio for node in r.cluster.nodes]
    assert final == pytest.approx([0.3 + 0.05 * 5] * 2, abs=1e-3)     # a step at each window close, 1 s to 5 s
    c = s["controller"]
    assert c["decisions"] == sum(len(ctl.latency_ns) for ctl in r.cluster.policy.ctl.values()) >= 10
    assert c["decision_us_p50"] > 0 and c["burst_events"] == [] and c["slewed"] == 0
    assert c["adapter_estimates"] == c["adapter_steps"] == 0                   # the base alone: no adapter


def test_burst_events_reach_the_results():
    """A x3.84 burst from 37.24 s to 40.97 s: both nodes' recovery tiers start at the end of the
    first window the burst mostly fills (37-38 s, 0.76 s of it), and the events are in the run's
    summary."""
    from helmgr.sim import SimConfig, simulate
    from helmgr.policy.helm import HelmPolicy
    from tests.test_sim import short_burst
    w = short_burst(seed=1, duration_s=60.0)
    assert [(round(b.start, 2), round(b.end, 2)) for b in w.bursts] == [(37.24, 40.97)]
    r = simulate(SimConfig(nodes=2, ratio=0.5, router="helm", warmup_s=2.0), w, policy=HelmPolicy())
    assert r.summary["controller"]["burst_events"] == [{"node": 0, "t": 38.0, "event": "start"},
                                                       {"node": 1, "t": 38.0, "event": "start"}]
    assert [c.safety.bad_input for c in r.cluster.policy.ctl.values()] == [0, 0]  # the simulator's windows: all taken
    # adapter v2: a sample at each window after a refresh (2, 4, ..., 36 s) and none once the
    # burst froze it (the window closing at 38 s froze it before its sample): 18 a node
    assert r.summary["controller"]["adapter_estimates"] == 36


def test_recovery_refill_streams_only_while_the_recovery_tier_holds_the_node():
    """`--refill recovery` under HELM: lazy (no refill bytes) until the recovery tier starts at
    38 s (the burst of test_burst_events_reach_the_results), then a background stream on both
    nodes while recovery lasts (it has not handed back by the end): node 0's recovery grows its
    EMB share, node 1's refresh makes rows wanted, and both are streamed in."""
    from helmgr.memory.link import REFILL
    from helmgr.policy.helm import HelmPolicy
    from helmgr.sim import SimConfig, simulate
    from tests.test_sim import short_burst
    seen = []                                  # after each 1-s chunk: refill bytes and `active`, per node

    def watch(cluster):
        seen.append(([n.link.bytes_by_cause[REFILL] for n in cluster.nodes], [n.refill.active for n in cluster.nodes]))

    r = simulate(SimConfig(nodes=2, ratio=0.1, router="helm", warmup_s=2.0, refill="recovery"),
                 short_burst(seed=1, duration_s=45.0), policy=HelmPolicy(), stop=watch)
    assert r.summary["sim_path"] == "python"
    assert [e["t"] for e in r.summary["controller"]["burst_events"]] == [38.0, 38.0]
    assert all(b == [0, 0] and a == [False, False] for b, a in seen[:37])      # chunks before the start
    assert all(a == [True, True] for _, a in seen[39:])
    assert all(x > 0 for x in seen[-1][0])


def test_relative_reward_is_zero_for_holding_and_moves_when_the_policy_moves():
    env = HelmEnv(**TINY, relative=True)
    env.reset(seed=5)
    held = [env.step(np.array([0.0], np.float32))[1] for _ in range(3)]
    assert held == [0.0, 0.0, 0.0]                       # the twin is the same cluster, same requests
    _, info = env.reset(seed=5)
    moved = [env.step(np.array([1.0], np.float32))[1] for _ in range(3)]
    assert env.twin.nodes[0].ratio == pytest.approx(info["ratio"], abs=1e-3)          # the twin held
    assert env.cluster.nodes[0].ratio == pytest.approx(min(0.95, info["ratio"] + 0.15), abs=1e-3)
    assert all(m != 0.0 for m in moved)


def test_the_shipped_policy_loads_and_decides():
    import helmgr
    ctl = helmgr.Controller.default()
    assert ctl.base.n_obs == N_FEATURES_V1 and "--timesteps 122880 --seed 3" in ctl.base.meta["command"]
    r = ctl.step(stats(0.5))
    assert 0.4 <= r <= 0.6 and len(ctl.latency_ns) == 1


def _widened(p: MLPPolicy) -> MLPPolicy:
    """`p` with one more input, "marginal_ms", that it gives no weight."""
    w = [np.hstack([p.w[0], np.zeros((p.w[0].shape[0], 1))])] + p.w[1:]
    return MLPPolicy(w, p.b, np.append(p.obs_mean, 0.0), np.append(p.obs_var, 1.0), p.obs_clip, p.obs_eps, p.max_step)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_ten_input_base_decides_as_its_widened_twin(compiled):
    """A base trained before "marginal_ms" reads the first ten features: step for step it decides as
    the same network given the eleventh input with zero weight, counterfactual samples or not."""
    rng = np.random.default_rng(3)
    p10 = MLPPolicy([rng.normal(0, 1, (8, N_FEATURES_V1)), rng.normal(0, 1, (1, 8))], [rng.normal(0, 1, 8),
                    np.zeros(1)], rng.normal(0, 0.2, N_FEATURES_V1), rng.uniform(0.5, 2, N_FEATURES_V1), max_step=0.05)
    ratios = []
    for base in (p10, _widened(p10)):
        ctl = stepper(compiled, Controller(base, safety=Safety(max_slew=0.1)))
        r, run = 0.5, []
        for k in range(40):
            r = ctl.step(stats(r, rps=300 + 50 * math.sin(k), p99=0.01 + 0.002 * (k % 5)),
                         None if k % 2 else float(rng.normal(0, 0.002)))
            run.append(r)
        ratios.append(run)
    assert ratios[0] == ratios[1] and len(set(ratios[0])) > 5


def test_a_base_reading_marginal_ms_gets_shadows_that_change_nothing_else(tmp_path):
    """helm-base tracks the shadows only for a base that reads the counterfactual; tracking them
    changes no request: a ten-input base and its widened twin give the same run."""
    from helmgr.sim import SimConfig, simulate
    from helmgr.policy.helm import HelmBase
    from tests.test_sim import small
    rng = np.random.default_rng(4)
    p10 = MLPPolicy([rng.normal(0, 1, (1, N_FEATURES_V1))], [np.zeros(1)], np.zeros(N_FEATURES_V1),
                    np.ones(N_FEATURES_V1), max_step=0.05)
    p10.save(tmp_path / "p10.npz")
    _widened(p10).save(tmp_path / "p11.npz")
    runs = {}
    for name in ("p10", "p11"):
        policy = HelmBase(str(tmp_path / f"{name}.npz"))
        r = simulate(SimConfig(nodes=2, ratio=0.5, router="helm", warmup_s=2.0), small(duration_s=8.0), policy=policy)
        runs[name] = r.summary, [n.ratio for n in r.cluster.nodes], policy.sampler
    assert runs["p10"][2] is None and runs["p11"][2] is not None
    drop = ("wall_s", "controller", "sim_rps")
    assert {k: v for k, v in runs["p10"][0].items() if k not in drop} == \
        {k: v for k, v in runs["p11"][0].items() if k not in drop}
    assert runs["p10"][1] == runs["p11"][1]


def test_env_frees_the_last_episode_at_reset():
    """A cluster is a web of reference cycles: left to the collector, a PPO worker's episodes piled
    up (~130 MB each with the shadows) until the OOM killer took it. reset frees the last one."""
    import weakref
    env = HelmEnv(**TINY, relative=True)
    env.reset(seed=1)
    old, twin = weakref.ref(env.cluster), weakref.ref(env.twin)
    env.reset(seed=2)
    assert old() is None and twin() is None and env.cluster is not None
