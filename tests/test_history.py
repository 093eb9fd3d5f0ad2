"""The history store: built from a log, read by position, appended durably, torn tails cut."""
import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from helmgr.cli import main
from helmgr.core.errors import HelmInputError
from helmgr.history import HistoryStore, build
from helmgr.history.store import HEADER

# user, item, time: user 1's two actions at t=5 keep their file order; user 2 has none; 3 users, 9 items
USER = np.array([1, 0, 1, 0, 1, 1])
ITEM = np.array([7, 3, 8, 4, 2, 6])
TIME = np.array([5.0, 1.0, 5.0, 0.5, 2.0, 9.0])


@pytest.fixture
def store(tmp_path):
    with build(tmp_path / "h", USER, ITEM, TIME, n_users=3, n_items=9, source="tiny") as s:
        yield s


def test_each_user_reads_their_items_in_time_order(store):
    assert [store.length(u) for u in range(4)] == [2, 4, 0, 0]          # user 3: not in the log
    assert store.items(0, 0, 2).tolist() == [4, 3]
    assert store.items(1, 0, 4).tolist() == [2, 7, 8, 6]                  # t = 2, 5, 5 (file order), 9
    assert store.items(1, 1, 3).tolist() == [7, 8] and store.items(2, 0, 0).tolist() == []
    with pytest.raises(IndexError, match="user 1 has 4 actions, asked for positions 2..5"):
        store.items(1, 2, 5)


def test_appends_follow_the_base_and_survive_a_reopen(store):
    assert store.append(1, [5]) == 5 and store.append(1, [0, 1]) == 7 and store.append(7, [3]) == 1
    assert store.items(1, 3, 7).tolist() == [6, 5, 0, 1] and store.items(7, 0, 1).tolist() == [3]
    store.close()
    with HistoryStore(store.folder) as again:
        assert again.items(1, 0, 7).tolist() == [2, 7, 8, 6, 5, 0, 1] and again.length(7) == 1
        assert again.stat() | {"source": ""} == {"users": 4, "actions": 10, "base_users": 3, "base_actions": 6,
                                                 "appends": 3, "appended_actions": 4, "items": 9,
                                                 "torn_bytes_cut": 0, "source": ""}


@pytest.mark.parametrize("tail", ["torn", "corrupt"])
def test_a_torn_or_corrupt_last_append_is_cut_whole(store, tail):
    store.append(0, [1, 2])
    store.close()
    journal = store.folder / "journal.bin"
    items = np.array([5, 6, 7], np.int64).tobytes()
    frame = HEADER.pack(0, 3, 0 if tail == "corrupt" else zlib.crc32(items)) + items
    with open(journal, "ab") as f:
        f.write(frame[:-5] if tail == "torn" else frame)                  # a crash mid-write; a bad CRC
    with HistoryStore(store.folder) as again:
        assert again.length(0) == 4 and again.stat()["torn_bytes_cut"] == len(frame) - (5 if tail == "torn" else 0)
        assert again.append(0, [8]) == 5                                  # appends go on after the cut
    with HistoryStore(store.folder) as third:
        assert third.items(0, 0, 5).tolist() == [4, 3, 1, 2, 8] and third.stat()["torn_bytes_cut"] == 0


def test_an_append_acknowledged_before_a_kill_is_there_after_it(store):
    """A writer appends one item at a time to user 0 and prints each length once append returns;
    it is killed (SIGKILL) mid-stream. Every acknowledged append is in the store opened after."""
    store.close()
    code = ("import sys\nfrom helmgr.history import HistoryStore\ns = HistoryStore(sys.argv[1])\n"
            "for k in range(100000):\n    print(s.append(0, [k % 9]), flush=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(store.folder)], stdout=subprocess.PIPE, text=True,
                         env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    acked = [int(p.stdout.readline()) for _ in range(200)]
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with HistoryStore(store.folder) as again:
        n = again.length(0)
        assert acked == list(range(3, 203)) and n >= acked[-1]
        assert again.items(0, 2, n).tolist() == [k % 9 for k in range(n - 2)]


def test_writers_in_two_processes_share_a_store(store):
    """Two processes append 100 items each to user 0 at once: every length either acknowledges
    is its own (3 .. 202, none twice), and a reader sees all of them after refresh()."""
    code = ("import sys\nfrom helmgr.history import HistoryStore\ns = HistoryStore(sys.argv[1])\n"
            "print(' '.join(str(s.append(0, [int(sys.argv[2])])) for _ in range(100)))\n")
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(store.folder), str(k)], stdout=subprocess.PIPE,
                              text=True, env=env) for k in (1, 2)]
    acked = [list(map(int, p.communicate()[0].split())) for p in procs]
    assert sorted(acked[0] + acked[1]) == list(range(3, 203))
    assert store.length(0) == 2
    store.refresh()
    got = store.items(0, 2, 202)
    assert store.length(0) == 202 and (got == 1).sum() == (got == 2).sum() == 100
    other = HistoryStore(store.folder)
    assert other.append(0, [5]) == 203 and store.append(0, [6]) == 204     # each counts the other's


def test_an_append_at_a_length_writes_only_if_the_history_is_that_long(store):
    assert store.append(0, [5], at=1) is None and store.length(0) == 2        # the caller saw a shorter one
    assert store.append(0, [5], at=2) == 3 and store.append(9, [1], at=0) == 1
    assert store.stat()["appends"] == 2


def test_bad_appends_and_folders_are_named_errors(store, tmp_path):
    for user, items, what in ((0, [9], "each in \\[0, 9\\)"), (0, [], "1 or more items"), (-1, [1], "user -1")):
        with pytest.raises(HelmInputError, match=what):
            store.append(user, items)
    assert store.length(0) == 2 and store.stat()["appends"] == 0        # nothing written
    with pytest.raises(HelmInputError, match="already exists"):
        build(store.folder, USER, ITEM, TIME, 3, 9)
    with pytest.raises(HelmInputError, match="is not a history store"):
        HistoryStore(tmp_path)


def test_the_cli_builds_and_counts(capsys, tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("u1 a b c\nu2 c\nu3 a d\n")
    assert main(["history", "build", "--trace", str(log), "--trace-format", "sequences", "--out",
                 str(tmp_path / "h"), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert (built["users"], built["actions"], built["items"]) == (3, 6, 4)
    with HistoryStore(tmp_path / "h") as s:
        assert s.items(0, 0, 3).tolist() == [0, 1, 2]                    # u1: a b c, items numbered a..d
        s.append(1, [3])
    assert main(["history", "stat", str(tmp_path / "h"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"] == 7
    assert main(["history", "build", "--trace", str(log), "--trace-format", "sequences", "--out",
                 str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and err.count("\n") == 1


def test_a_real_log(shared_data, tmp_path):
    from helmgr.workload.trace import read_trace
    log = read_trace(str(shared_data / "ml-100k.inter"), "inter")
    with build(tmp_path / "h", log.user, log.item, log.time, log.n_users, log.n_items) as s:
        assert s.stat()["users"] == 943 and s.stat()["actions"] == 100_000
        mine = np.flatnonzero(log.user == 5)
        want = log.item[mine[np.argsort(log.time[mine], kind="stable")]]
        assert s.items(5, 0, s.length(5)).tolist() == want.tolist()
