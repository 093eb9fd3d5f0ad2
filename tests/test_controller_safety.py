"""Controller safety for any input: whatever a stack reports, `step` returns a finite
ratio in [r_min, r_max]; a window with a non-finite or impossible value is counted
(`safety.bad_input`), answered by the fallback (the ratio set last; before any, the reported ratio
clamped if it is a ratio, else `Safety.start`) and learned from by nothing; a field that is not a
number raises TypeError naming it."""
import copy
import functools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import helmgr
from helmgr.controller import Controller, WindowStats
from helmgr.controller import layout as L
from helmgr.controller.safety import Safety
from tests import controller_reference as ref
from tests.test_controller import constant_policy
from tests.test_controller_kernel import controller, samples, stats_stream


def window(**kw) -> WindowStats:
    return WindowStats(**{"ratio": 0.5, "arrival_rps": 300, "p99_s": 0.01, "slo_s": 0.03, **kw})


def in_range(ctl, r) -> bool:
    return math.isfinite(r) and ctl.safety.r_min <= r <= ctl.safety.r_max


# -- the reproducers from issue 23 ------------------------------------------------------------
@pytest.mark.parametrize("kw,expected", [({"ratio": math.nan}, 0.5), ({"ratio": math.inf}, 0.5),
                                         ({"slo_s": 0}, 0.5), ({"slo_s": 0, "ratio": 0.99}, 0.95)])
def test_issue_reproducers_get_the_fallback_and_are_counted(kw, expected):
    ctl = helmgr.Controller.default()
    assert ctl.step(window(**kw)) == expected and ctl.safety.bad_input == 1
    assert ctl.windows == 1 and len(ctl.latency_ns) == 1 and ctl.last is None     # nothing was learned


def test_a_string_ratio_is_a_type_error_naming_the_field():
    with pytest.raises(TypeError, match=r"WindowStats\.ratio must be a real number, got 'x'"):
        window(ratio="x")


@pytest.mark.parametrize("field,value", [("ratio", None), ("slo_s", "0.03"), ("arrival_rps", [300.0]),
                                         ("queue_len", 1 + 2j), ("emb_hit_rate", np.array([0.9])),
                                         ("p99_s", "none")])
def test_non_numbers_are_type_errors_naming_the_field(field, value):
    with pytest.raises(TypeError, match=rf"WindowStats\.{field} must be a real number"):
        window(**{field: value})
    ok = window()                          # an object that skipped the check: step's own slow path names it
    object.__setattr__(ok, field, value)
    with pytest.raises(TypeError, match=rf"WindowStats\.{field} must be a real number"):
        Controller.default().step(ok)


# -- the fallback -------------------------------------------------------------------------------
def test_fallback_before_any_good_window_then_the_last_ratio_set():
    ctl = Controller(constant_policy(1.0, max_step=0.05), safety=Safety(max_slew=0.1, start=0.3))
    assert ctl.step(window(ratio=math.nan)) == 0.3                   # no ratio at all: the start
    assert ctl.step(window(ratio=2.0)) == 0.3                        # not a ratio either
    assert ctl.step(window(ratio=0.01, slo_s=-1)) == 0.05           # a ratio: the node's, clamped
    assert ctl.step(window(ratio=0.6, arrival_rps=math.nan)) == 0.6
    assert ctl.step(window(ratio=0.6)) == pytest.approx(0.65)       # a good window decides
    for bad in (window(ratio=math.nan), window(ratio=0.2, p99_s=math.nan), window(ratio=0.2, emb_hit_rate=1.5)):
        assert ctl.step(bad) == pytest.approx(0.65)                  # the last ratio set
    assert ctl.safety.bad_input == 7 and ctl.windows == 8
    assert Controller(None).step(window(ratio=-math.inf)) == 0.5    # default start: mid-range
    with pytest.raises(ValueError, match="start"):
        Safety(start=0.99)


REFUSED = [("ratio", -0.1), ("ratio", 1.5), ("ratio", math.nan), ("arrival_rps", -1.0), ("arrival_rps", math.inf),
           ("p99_s", -0.01), ("p99_s", math.nan), ("p99_s", math.inf), ("slo_s", 0.0), ("slo_s", -0.03),
           ("slo_s", math.inf), ("emb_hit_rate", 1.01), ("emb_hit_rate", -0.5), ("kv_hit_rate", math.nan),
           ("queue_len", -1.0), ("queue_len", math.inf), ("h2d_utilization", 2.0), ("new_user_share", -0.1),
           ("new_user_share", math.inf), ("emb_time_share", math.nan), ("emb_time_share", 1.2),
           ("arrival_rps", 10**400), ("queue_len", Decimal("NaN")), ("queue_len", Decimal("sNaN"))]


@pytest.mark.parametrize("field,value", REFUSED)
def test_each_bad_field_is_refused_and_touches_nothing(field, value):
    """After 50 plausible windows, one window with this value: counted, answered with the last
    ratio, and the controller's whole memory is what it was, but for the counter; the reference
    refuses it too."""
    ctl = controller(adapter=True, recovery=True)
    for s in stats_stream(1, 50):
        last = ctl.step(s)
    mem, bad = ctl._k[0].copy(), window(**{field: value})
    assert ctl.step(bad) == last and ctl.safety.bad_input == 1
    mem[L.BAD_INPUT] += 1
    np.testing.assert_array_equal(ctl._k[0], mem)
    assert ref.stats_ok(window()) and not ref.stats_ok(bad)


@pytest.mark.parametrize("kw", [{}, {"p99_s": None}, {"new_user_share": 1.5}, {"ratio": 1, "emb_hit_rate": 0},
                                {"arrival_rps": 1e300, "queue_len": 1e300, "p99_s": 1e300}, {"arrival_rps": 10**300}])
def test_plausible_and_extreme_but_possible_windows_are_taken(kw):
    """None is a window with no request; a share of new users above 1 happens (counted as
    requests start, divided by those completed); huge finite rates are numbers."""
    ctl = Controller.default()
    assert in_range(ctl, ctl.step(window(**kw))) and ctl.safety.bad_input == 0


def test_numbers_numba_does_not_take_decide_as_their_floats():
    a, b = Controller.default(), Controller.default()
    for k in range(5):
        exotic = window(ratio=Fraction(1, 2), arrival_rps=Decimal(300 + k), slo_s=Fraction(3, 100), queue_len=np.int8(k))
        plain = window(ratio=0.5, arrival_rps=300.0 + k, slo_s=0.03, queue_len=float(k))
        assert a.step(exotic) == b.step(plain)
    assert a.safety.bad_input == 0 and np.array_equal(a._k[0], b._k[0], equal_nan=True)


def test_a_failed_proposal_on_a_first_window_outside_the_bounds_is_clamped():
    """The ratio set is in [r_min, r_max] from the first window, even when the node starts outside
    them and the proposal is NaN, or the target is within min_move of a ratio outside them."""
    assert Controller(constant_policy(math.nan)).step(window(ratio=0.01)) == 0.05
    ctl = Controller(constant_policy(-1.0, max_step=0.03), safety=Safety(max_slew=0.1, min_move=0.03))
    assert ctl.step(window(ratio=0.97)) == pytest.approx(0.94)      # slew 0.97 -> 0.94, not held at 0.97


# -- any input --------------------------------------------------------------------------------
def fork(ctl: Controller) -> Controller:
    """A copy of a controller and its running state (the kernel's views rebuilt on the copy's memory)."""
    c = copy.deepcopy(ctl)
    c._k = c._k[:4] + (L.views(c._k[0]),)
    return c


@functools.cache
def after_history():
    """A controller and its reference after the same 200 windows (a burst, adapter steps): every
    example below starts from copies of these."""
    fast = controller(True, True)
    slow = ref.ReferenceController(fast)
    for s, m in zip(stats_stream(1, 200), samples(4, 200)):
        assert fast.step(s, m) == pytest.approx(slow.step(s, m), abs=1e-12)
    assert fast.adapter.applied > 0
    return fast, slow


NUMBER = st.one_of(st.floats(), st.floats(-2.0, 2.0), st.integers(-2**70, 2**70), st.just(10**400))
WILD = st.builds(WindowStats, ratio=NUMBER, arrival_rps=NUMBER, p99_s=st.none() | NUMBER, slo_s=NUMBER,
                 emb_hit_rate=NUMBER, kv_hit_rate=NUMBER, queue_len=NUMBER, h2d_utilization=NUMBER,
                 new_user_share=NUMBER, emb_time_share=NUMBER)
SHARE = st.floats(0.0, 1.0)
GOOD = st.builds(WindowStats, ratio=SHARE, arrival_rps=st.floats(0.0, 3000.0), p99_s=st.none() | st.floats(0.0, 1.0),
                 slo_s=st.floats(1e-3, 1.0), emb_hit_rate=SHARE, kv_hit_rate=SHARE, queue_len=st.floats(0.0, 500.0),
                 h2d_utilization=SHARE, new_user_share=SHARE, emb_time_share=SHARE)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(GOOD, WILD), min_size=1, max_size=40))
def test_any_window_gets_a_safe_ratio_and_refused_ones_poison_nothing(windows):
    """After the same history, a stream of plausible and arbitrary windows: every answer finite
    and in range, no exception; the refused windows counted; the reference agrees; and the
    windows taken decide exactly as they would with the refused ones left out, down to the last
    bit of the controller's memory (but for the counter and the last window's event flag)."""
    fast, slow = after_history()
    mixed, clean, slow = fork(fast), fork(fast), copy.deepcopy(slow)
    before, taken = mixed.safety.bad_input, []
    for s in windows:
        r, refused = mixed.step(s), mixed.safety.bad_input
        assert in_range(mixed, r) and r == pytest.approx(slow.step(s), abs=1e-12)
        assert refused == slow.safety.bad_input
        if refused == before:
            taken.append((s, r))
        before = refused
    for s, r in taken:
        assert clean.step(s) == r
    assert mixed.safety.bad_input == clean.safety.bad_input + len(windows) - len(taken)
    a, b = mixed._k[0].copy(), clean._k[0].copy()
    a[[L.BAD_INPUT, L.EVENT]] = b[[L.BAD_INPUT, L.EVENT]] = 0.0
    np.testing.assert_array_equal(a, b)
    assert mixed.adapter.params.tolist() == clean.adapter.params.tolist()
    assert [e for _, e in mixed.events] == [e for _, e in clean.events]     # numbered by window seen


def test_a_signalling_nan_p99_is_refused_not_raised():
    ctl = Controller.default()
    assert ctl.step(WindowStats(ratio=0.5, arrival_rps=300, p99_s=Decimal("sNaN"), slo_s=0.03)) == 0.5
    assert ctl.safety.bad_input == 1
