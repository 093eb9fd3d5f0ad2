"""The history store: built from a log, read by position, appended durably, torn tails cut."""
import io
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
                                                 "torn_bytes_cut": 0, "torn_bytes_left": 0, "source": ""}


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


def _offsets(a):
    return lambda folder: np.save(folder / "offsets.npy", a)


def _write(name: str, data: bytes):
    return lambda folder: (folder / name).write_bytes(data)


def _journal_folder(folder):
    (folder / "journal.bin").unlink()
    (folder / "journal.bin").mkdir()


@pytest.mark.parametrize("damage,needle", [
    (_write("meta.json", b"{nope"), "meta.json is not readable JSON"),
    (_write("meta.json", b"[1, 2]"), "meta.json must be a JSON object, it is a JSON list"),
    (_write("meta.json", b'{"format": 1}'), "users, items, base_actions must be integers >= 0"),
    (_write("meta.json", b"\xff\xfe{}"), "meta.json is not readable JSON ('utf-8' codec"),
    (lambda f: (f / "base.npy").write_bytes((f / "base.npy").read_bytes()[:-5]), "base.npy is not a readable .npy"),
    (_write("base.npy", b""), "base.npy is not a readable .npy array (the file is empty)"),
    (_write("offsets.npy", bytes(range(256))), "offsets.npy is not a readable .npy array (no .npy header)"),
    (_offsets(np.array([0, -5, 10**12])), "offsets.npy has 3 entries, meta.json's 3 users need 4"),
    (_offsets(np.array([0, 2, 6, 10**12])), "offsets.npy must rise from 0 to base.npy's length 6 without falling"),
    (_offsets(np.array([0, 4, 2, 6])), "offsets.npy must rise from 0 to base.npy's length 6 without falling"),
    (_offsets(np.zeros((2, 3))), "offsets.npy must be a 1-D int64 array, it is float64 of shape (2, 3)"),
    (_offsets(np.array([0, 6])), "offsets.npy has 2 entries, meta.json's 3 users need 4"),
    (lambda f: np.save(f / "base.npy", np.array([4, 3, 2, 7, 8, 9])), "base.npy holds items outside [0, 9)"),
    (lambda f: (f / "meta.json").write_text((f / "meta.json").read_text().replace('actions": 6', 'actions": 7')),
     "base.npy holds 6 items, meta.json says base_actions 7"),
    (_journal_folder, "cannot open journal.bin (Is a directory)"),
])
def test_a_broken_store_is_refused_in_one_line_naming_the_file(capsys, store, damage, needle):
    """Each file cut short, garbled or at odds with the others (offsets that would count 2 users or
    0 where meta.json says 3): `history stat` exits 2 with one line, and a writer's open refuses it."""
    store.close()
    damage(store.folder)
    assert main(["history", "stat", str(store.folder), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("helmgr: error: history store ")
    assert needle in err and str(store.folder) in err, err
    with pytest.raises(HelmInputError, match="history store"):
        HistoryStore(store.folder)


def test_stat_only_reads_a_journal_with_a_garbage_tail(capsys, store):
    """`history stat` on a journal ending in 1000 garbage bytes counts them and leaves the file as
    it was; a writer's open then cuts them (crash recovery) and keeps the whole append."""
    store.append(0, [1, 2])
    store.close()
    journal = store.folder / "journal.bin"
    with open(journal, "ab") as f:
        f.write(np.random.default_rng(0).bytes(1000))
    before = journal.read_bytes()
    assert main(["history", "stat", str(store.folder), "--json"]) == 0
    stat = json.loads(capsys.readouterr().out)
    assert (stat["appends"], stat["torn_bytes_left"], stat["torn_bytes_cut"]) == (1, 1000, 0)
    assert main(["history", "stat", str(store.folder)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ends in 1000 bytes that are no whole append" in err
    assert journal.read_bytes() == before                                 # nothing written
    with HistoryStore(store.folder) as writer:
        assert writer.stat()["torn_bytes_cut"] == 1000 and writer.length(0) == 4
    assert journal.read_bytes() == before[:-1000]


def test_a_read_only_store_never_writes(store):
    """A read-only open sees the writers' appends after refresh, refuses its own, and leaves a
    missing journal missing."""
    reader = HistoryStore(store.folder, read_only=True)
    store.append(0, [5])
    assert reader.length(0) == 2
    reader.refresh()
    assert reader.length(0) == 3 and reader.items(0, 2, 3).tolist() == [5]
    size = (store.folder / "journal.bin").stat().st_size
    with pytest.raises(io.UnsupportedOperation, match="opened read-only"):
        reader.append(0, [6])
    assert (store.folder / "journal.bin").stat().st_size == size
    reader.close()
    store.close()
    (store.folder / "journal.bin").unlink()
    with HistoryStore(store.folder, read_only=True) as again:
        assert again.length(0) == 2 and again.stat()["appends"] == 0
    assert not (store.folder / "journal.bin").exists()


@pytest.mark.parametrize("command", ["build", "stat"])
def test_an_empty_redis_url_is_refused_by_name(capsys, tmp_path, command):
    log = tmp_path / "log.txt"
    log.write_text("u1 a b\n")
    argv = ["--trace", str(log), "--trace-format", "sequences"] if command == "build" else []
    assert main(["history", command, *argv, "--redis", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("helmgr: error: --redis '' is empty: give a URL")
