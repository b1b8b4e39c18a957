"""The verify-cost curve's learning: a prior from another session and this session's timings kept consistent."""

from specdec_cli.decoding.cost_curve import STALE_STEPS, STALE_STEPS_MOST, WINDOW, CostCurve

QUIET = {1: 1.0, 2: 1.05, 4: 1.2, 8: 1.5, 12: 2.0}  # a prior measured on a quiet machine


def test_an_unobserved_row_count_follows_the_observed_level():
    """Steps timed on a busy machine (everything 2x the prior) must not leave a never-verified row count at its
    quiet prior, cheaper than the counts the steps did time: the planner would pad every step up to it."""
    curve = CostCurve(QUIET)
    for _ in range(WINDOW):
        for rows in (1, 2, 4, 8):
            curve.observe(rows, 2 * QUIET[rows])
    assert curve(12) == 2 * QUIET[12]
    assert curve(12) > curve(8) > curve(1)
    assert curve.cheapest_at_least(8, 12) == 8 and curve.cheapest_at_least(1, 12) == 1


def test_the_level_is_the_median_ratio_and_one_without_observations():
    curve = CostCurve(QUIET)
    assert curve.seconds == QUIET  # nothing observed: the prior as it is
    for _ in range(WINDOW):
        curve.observe(1, 3.0)  # one count at 3x, two at 1.5x: the median ratio is 1.5
        curve.observe(2, 1.5 * QUIET[2])
        curve.observe(4, 1.5 * QUIET[4])
    assert abs(curve(8) - 1.5 * QUIET[8]) < 1e-12
    assert curve(1) == 3.0  # an observed count keeps its own estimate


def test_a_fixed_curve_ignores_observations_and_keeps_its_prior():
    curve = CostCurve.fixed(QUIET)
    curve.observe(1, 10.0)
    assert curve.seconds == QUIET


def test_a_count_timed_on_a_busy_host_is_not_dear_once_the_host_is_quiet():
    """Four-row steps timed while everything ran at 2x, then only plain steps on the quiet host (a planner that
    thinks four rows dear verifies none, so nothing would correct them): four rows cost what the quiet host's
    one-row steps say, times the ratio the busy steps measured, not the busy seconds."""
    curve = CostCurve(QUIET)
    for _ in range(WINDOW):
        curve.observe(1, 2 * QUIET[1])
        curve.observe(4, 2 * QUIET[4])
    assert abs(curve(4) - 2 * QUIET[4]) < 1e-12
    for _ in range(WINDOW):
        curve.observe(1, QUIET[1])
    assert abs(curve(4) - QUIET[4]) < 1e-12 and abs(curve(4) / curve(1) - QUIET[4] / QUIET[1]) < 1e-12
    absolute = CostCurve({4: 1.2, 8: 1.5})  # a prior without one row: counts are learned as they are timed
    absolute.observe(4, 3.0)
    assert absolute(4) == 1.2  # the lower quartile of the prior and one observation


def _probes(curve: CostCurve, steps: int, truth: dict) -> list[int]:
    """A session of one-row steps where every stale count is probed at once: the observations at which it was."""
    probes = []
    for _ in range(steps):
        curve.observe(1, truth[1])
        stale = curve.stale([size for size in truth if size > 1])
        if stale is not None:
            probes.append(curve.observations)
            curve.observe(stale, truth[stale])
    return probes


def test_a_count_whose_timings_agree_is_probed_ever_less_often_and_again_soon_once_they_do_not():
    """A probe runs a dearer forward than the step needed: settled counts are probed at doubling intervals, up to
    STALE_STEPS_MOST; a timing that disagrees with its estimate starts the count's interval over."""
    truth = {1: 1.0, 8: 2.0}
    curve = CostCurve(dict(truth))
    steps = 4 * STALE_STEPS_MOST
    probes = _probes(curve, steps, truth)
    assert len(probes) <= 8  # at a fixed STALE_STEPS it was steps / STALE_STEPS, 64
    gaps = [later - earlier for earlier, later in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and max(gaps) <= STALE_STEPS_MOST + 2
    dearer = {1: 1.0, 8: 4.0}  # the host changed: 8 rows now cost twice what the curve says
    after = _probes(curve, 2 * STALE_STEPS_MOST, dearer)
    assert after and after[1] - after[0] <= STALE_STEPS + 2  # the disagreeing probe made the next one come soon


def test_a_learning_curve_is_saved_now_and_then_under_a_name_made_once(tmp_path, monkeypatch):
    """A save is a synced write (a request's worth of time on a server): at most one each SAVE_SECONDS."""
    from specdec_cli.decoding import curve_store

    named = []
    store = curve_store.CurveStore(lambda: named.append(1) or tmp_path / "curve.json", lambda: None)
    clock = [1000.0]
    monkeypatch.setattr(curve_store.time, "monotonic", lambda: clock[0])
    curve = CostCurve({1: 1.0, 4: 2.0})
    saves = []
    monkeypatch.setattr(curve_store, "save_curve", lambda file, saved: saves.append(file))
    for _ in range(200):
        curve.observe(1, 1.0)
        clock[0] += 0.5  # a generation's close every half second
        store.keep(curve)
    assert len(saves) == 4 and set(saves) == {tmp_path / "curve.json"}  # after SAVE_EVERY steps, then each 30 s
    assert len(named) == 1


def test_a_stored_curve_is_one_per_kernels_build_and_kv_cache_dtype(monkeypatch, tmp_path):
    """What a step costs changes with the kernels' build and the native decoder's KV cache: each has its own
    stored curve, measured afresh, not one timed on the other (the same model, machine and settings otherwise)."""
    from helpers import family_model

    from specdec_cli import kernels
    from specdec_cli.decoding.curve_store import cost_cache_file
    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.native import quant

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    model = family_model("llama", seed=5)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "int8", None))
    model.config._name_or_path = "tiny-llama"
    first = cost_cache_file(model, 8)
    assert first is not None and cost_cache_file(model, 8) == first
    monkeypatch.setenv("SPECDEC_KV_CACHE", "bfloat16")
    other_cache = cost_cache_file(model, 8)
    monkeypatch.delenv("SPECDEC_KV_CACHE")
    monkeypatch.setattr(kernels, "build", lambda: "another-build")
    assert len({first, other_cache, cost_cache_file(model, 8)}) == 3
