"""``taccl profile``: the α-β fit, the measured topology (host model, merge), a real gloo profile, and its errors."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.topology import load_topology, route
from taccl_py.topology.measured import (
    AlphaBetaFit,
    ClassFit,
    HostProfile,
    ProfileProvenance,
    fit_alpha_beta,
    fit_samples,
    host_topology,
    link_class,
    merge_measured,
)
from taccl_py.topology.model import LinkKind
from taccl_py.topology.schema import generate_topology, parse_topology, read_topology

from helpers import error_line

SIZES = (4_000, 64_000, 1_000_000, 16_000_000)
PROVENANCE = ProfileProvenance("0.1.0", "gloo", 4, "cpu", SIZES, 5, 1, 3, "2026-11-26")


def _line(alpha_us: float, bandwidth_GBps: float) -> list[float]:
    return [alpha_us + size / (bandwidth_GBps * 1e3) for size in SIZES]


def _fit(alpha_us: float, bandwidth_GBps: float) -> AlphaBetaFit:
    return fit_alpha_beta(SIZES, _line(alpha_us, bandwidth_GBps))


@pytest.mark.parametrize(("alpha_us", "bandwidth_GBps"), [(25.0, 2.5), (300.0, 0.8), (0.5, 45.0)])
def test_the_fit_recovers_a_known_alpha_and_bandwidth_exactly(alpha_us: float, bandwidth_GBps: float) -> None:
    fit = _fit(alpha_us, bandwidth_GBps)
    assert fit.alpha_us == pytest.approx(alpha_us, rel=1e-9)
    assert fit.bandwidth_GBps == pytest.approx(bandwidth_GBps, rel=1e-9)
    assert fit.max_residual < 1e-9
    assert fit.time_us(2_000_000) == pytest.approx(alpha_us + 2_000_000 / (bandwidth_GBps * 1e3))


def test_the_fit_reports_its_residual_and_the_spread_of_repeats() -> None:
    rng = random.Random(30)
    exact = _line(100.0, 2.0)
    samples = [[t * (1 + rng.uniform(-0.2, 0.2)) for _ in range(9)] for t in exact]
    fit = fit_samples(SIZES, samples)
    assert fit.alpha_us == pytest.approx(100.0, rel=0.25)
    assert fit.bandwidth_GBps == pytest.approx(2.0, rel=0.25)
    assert 0 < fit.max_residual < 0.2
    assert 0.05 < fit.repeat_spread < 0.4  # the interquartile range of ±20% noise, over the median
    assert fit_samples(SIZES, [[t] for t in exact]).repeat_spread == 0.0


def test_a_negative_latency_is_clamped_to_zero_and_the_slope_refitted() -> None:
    fit = fit_alpha_beta([1_000_000, 2_000_000], [400.0, 1000.0])  # the line through them crosses at -200 µs
    assert fit.alpha_us == 0.0
    assert 0 < fit.bandwidth_GBps < 5
    assert fit.max_residual > 0.1


@pytest.mark.parametrize(
    ("sizes", "times", "pattern"),
    [
        ([1000, 1000], [5.0, 6.0], "1 distinct size"),
        ([1000, 2000], [5.0], "1 times for 2 sizes"),
        ([1000, 2000], [5.0, -1.0], "a time is not positive"),
        ([1000, 2000], [50.0, 20.0], "times do not grow with size between 1KB and 2KB"),
    ],
)
def test_a_fit_of_bad_data_is_refused(sizes: list[int], times: list[float], pattern: str) -> None:
    with pytest.raises(ArgumentError, match=pattern):
        fit_alpha_beta(sizes, times)


def test_the_host_model_shares_one_link_among_concurrent_transfers() -> None:
    from taccl_py.ir.collectives import Collective
    from taccl_py.runtime.measure.profile_model import ring_algorithm
    from taccl_py.simulate import simulate
    from taccl_py.simulate.model import WHOLE_CHUNKS

    host = HostProfile(PROVENANCE, _fit(50.0, 3.0), _fit(400.0, 1.0), 4)
    topology = host_topology(host)
    assert host.shared_bandwidth_GBps == pytest.approx(4.0)
    one = route(topology, 2, 1)
    assert [link.src for link in one.links] == ["gpu2", "host_tx", "host_rx"]
    assert one.alpha_us == pytest.approx(400.0) and one.bandwidth_GBps == pytest.approx(3.0)
    # a ring step: 4 transfers of M/4 at once share 4 GB/s, i.e. 1 GB/s each, as the ring shift measured
    size = 4_000_000
    expected = 3 * (400.0 + size / 4 / (1.0 * 1e3))
    ring = ring_algorithm(Collective.ALLGATHER, 4)
    assert simulate(ring, topology, size, model=WHOLE_CHUNKS).time_us == pytest.approx(expected, rel=1e-6)


def test_the_measured_topology_round_trips_with_its_provenance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = host_topology(HostProfile(PROVENANCE, _fit(50.0, 3.0), _fit(400.0, 1.0), 4))
    back = parse_topology(generate_topology(topology))
    assert back.links == topology.links and back.sources == topology.sources
    text = " ".join(back.sources)
    for fact in ("taccl_py 0.1.0", "backend gloo", "4 ranks", "sizes 4KB,64KB,1MB,16MB", "5 repeats", "2026-11-26"):
        assert fact in text
    assert "fit max residual" in text and "repeat spread" in text and "medians 4KB 404 us, 64KB 464 us" in text
    path = tmp_path / "measured.json"
    path.write_text(generate_topology(topology))
    assert main(["topo", "show", str(path)]) == 0
    assert "host" in capsys.readouterr().out


def test_merging_rescales_the_measured_class_and_leaves_the_others() -> None:
    ndv2 = load_topology("ndv2")
    assert link_class(ndv2, 0, 1) is LinkKind.NVLINK and link_class(ndv2, 0, 6) is LinkKind.PCIE
    double, single = route(ndv2, 0, 1), route(ndv2, 0, 2)  # 2 NVLinks, 1 NVLink
    merged = merge_measured(ndv2, [ClassFit(LinkKind.NVLINK, 0, 1, _fit(2.0, 20.0))], PROVENANCE)
    assert route(merged, 0, 1).alpha_us == pytest.approx(2.0)
    assert route(merged, 0, 1).bandwidth_GBps == pytest.approx(20.0)
    assert route(merged, 0, 2).bandwidth_GBps == pytest.approx(20.0 * single.bandwidth_GBps / double.bandwidth_GBps)
    assert route(merged, 0, 6).links == route(ndv2, 0, 6).links
    assert merged.sources[: len(ndv2.sources)] == ndv2.sources
    assert any("nvlink links, measured on 0->1" in s for s in merged.sources)
    parse_topology(generate_topology(merged))  # still a valid file
    with pytest.raises(ArgumentError, match="pair 0->6 is not nvlink"):
        merge_measured(ndv2, [ClassFit(LinkKind.NVLINK, 0, 6, _fit(2.0, 20.0))])
    with pytest.raises(ArgumentError, match="class nvlink measured twice"):
        merge_measured(ndv2, [ClassFit(LinkKind.NVLINK, 0, 1, _fit(2.0, 20.0))] * 2)


def test_merging_never_makes_alpha_negative() -> None:
    ndv2 = load_topology("ndv2")
    merged = merge_measured(ndv2, [ClassFit(LinkKind.NVLINK, 0, 1, replace(_fit(2.0, 20.0), alpha_us=0.0))])
    assert min(link.alpha_us for link in merged.links) >= 0.0


def _two_gpu_topology(path: Path) -> Path:
    document = {
        "schema": "taccl-topology/1",
        "name": "pair",
        "vertices": [
            {"name": "gpu0", "kind": "gpu", "local_index": 0},
            {"name": "gpu1", "kind": "gpu", "local_index": 1},
        ],
        "links": [{"src": "gpu0", "dst": "gpu1", "kind": "pcie", "alpha_us": 1.0, "bandwidth_GBps": 12.0}],
    }
    path.write_text(json.dumps(document))
    return path


@pytest.mark.multiprocess
def test_a_gloo_profile_writes_a_topology_that_bench_predicts_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "measured.json"
    argv = ["profile", "--nproc", "2", "--sizes", "16KB,1MB,32MB", "--repeats", "3", "--date", "2026-11-26"]
    assert main([*argv, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lone pair" in printed and "ring shift x2" in printed and f"wrote {out}" in printed
    measured = read_topology(out)
    assert measured.num_ranks == 2 and measured.description.startswith("2 ranks of one host (gloo, cpu)")
    assert "backend gloo, 2 ranks, device cpu, sizes 16KB,1MB,32MB, 3 repeats" in measured.sources[0]
    assert all(link.bandwidth_GBps > 0 for link in measured.links)
    bench = ["bench", "--ring", "--nproc", "2", "--sizes", "1MB", "--iters", "1", "--warmup", "0"]
    assert main([*bench, "--collective", "allgather", "--topology", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "ours_pred_us" in lines[0] and "torch_meas/pred" in lines[0]
    assert lines[2].split()[:3] == ["allgather", "1MB", "ring-allgather-2x1"]
    assert lines[-1].startswith("model error: median ")


@pytest.mark.multiprocess
def test_a_profile_per_link_class_merges_into_the_given_topology(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given, out = _two_gpu_topology(tmp_path / "pair.json"), tmp_path / "merged.json"
    argv = ["profile", "--nproc", "2", "--sizes", "16KB,1MB,32MB", "--repeats", "3", "--topology", str(given)]
    assert main([*argv, "-o", str(out)]) == 0
    assert "class pcie" in capsys.readouterr().out
    merged = read_topology(out)
    assert merged.name == "pair" and merged.link("gpu0", "gpu1").bandwidth_GBps != 12.0
    assert any(s.startswith("pcie links, measured on 0->1: alpha") for s in merged.sources)


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--nproc", "2", "--topology", "ndv2"], "ndv2: --topology: 8 GPUs for 2 ranks; expected one GPU per rank (2)"),
        (["--nproc", "2", "--topology", "no/such.json"], "no/such.json: no such built-in topology or file"),
        (["--nproc", "2", "--sizes", "1MB"], "--sizes: 1 distinct size(s); expected at least two sizes to fit"),
        (["--nproc", "2", "--repeats", "0"], "repeats: 0 repeats, 1 warm-up; expected 1 or more repeats"),
        (["--nproc", "1"], "--nproc: 1; expected 2 or more local ranks"),
        ([], "launch: not started by torchrun and no --nproc; expected torchrun --nproc-per-node N taccl profile"),
    ],
)
def test_profile_refuses_bad_input_before_starting_ranks(
    extra: list[str],
    pattern: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "m.json"
    status = main(["profile", "-o", str(out), *extra])
    captured = capsys.readouterr()
    assert status == 2 and pattern in error_line(captured.err) and captured.out == ""
    assert not out.exists()


def test_predictions_simulate_what_ran_and_gloos_schedule_for_torch() -> None:
    from taccl_py.ir.collectives import Collective
    from taccl_py.runtime.communicator.timing import BenchRow
    from taccl_py.runtime.measure.profile_model import model_error, predict_rows, ring_algorithm
    from taccl_py.simulate import simulate
    from taccl_py.simulate.model import WHOLE_CHUNKS

    topology = host_topology(HostProfile(PROVENANCE, _fit(50.0, 3.0), _fit(400.0, 1.0), 4))
    ring_ag, ring_ar = ring_algorithm(Collective.ALLGATHER, 4), ring_algorithm(Collective.ALLREDUCE, 4)
    rows = [
        BenchRow("allgather", 4_000_000, ring_ag.name, 5000.0, 6000.0),
        BenchRow("reducescatter", 4_000_000, "torch", 9000.0, 9000.0),
    ]
    ag, rs = predict_rows(rows, [ring_ag, None], topology)
    ring_ag_us = simulate(ring_ag, topology, 4_000_000, model=WHOLE_CHUNKS).time_us
    ring_ar_us = simulate(ring_ar, topology, 4_000_000, model=WHOLE_CHUNKS).time_us
    assert ag.ours_predicted_us == pytest.approx(ring_ag_us) and ag.torch_predicted_us == pytest.approx(ring_ag_us)
    # gloo's reduce_scatter_tensor is an all_reduce of the whole input: its ring all_reduce stands for it
    assert rs.ours_predicted_us == pytest.approx(ring_ar_us) and rs.torch_predicted_us == pytest.approx(ring_ar_us)
    errors = sorted(
        [abs(ring_ag_us - 5000) / 5000, abs(ring_ag_us - 6000) / 6000] + [abs(ring_ar_us - 9000) / 9000] * 2
    )
    error = model_error([ag, rs])
    assert error.count == 4 and error.worst == pytest.approx(errors[-1])
    assert error.median == pytest.approx((errors[1] + errors[2]) / 2)
    assert error.describe().startswith(f"model error: median {error.median:.0%}, worst {error.worst:.0%}")
    assert model_error(rows) is None


def _nccl_profile(rank: int, world_size: int, topology: str | None):
    from taccl_py.runtime.measure.profile import ProfileSpec, run_profile

    return run_profile(ProfileSpec((64_000, 1_000_000, 4_000_000), repeats=2, topology=topology))


@pytest.mark.multiprocess
def test_on_two_gpus_nccl_times_the_host_and_each_link_class(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the runtime extra)")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("CUDA not available: an NCCL profile needs 2 GPUs")
    from mp_utils import run_ranks

    # no group made by the harness: run_profile initialises NCCL from torchrun's variables, one GPU per rank
    host = run_ranks(_nccl_profile, 2, None, backend=None)[0]
    assert host.provenance.backend == "nccl" and host.provenance.device.startswith("cuda")
    assert host.host.pair.bandwidth_GBps > 0 and host.host.ring.bandwidth_GBps > 0
    given = _two_gpu_topology(tmp_path / "pair.json")
    classes = run_ranks(_nccl_profile, 2, str(given), backend=None)[0]
    assert [(c.kind, c.src, c.dst) for c in classes.classes] == [(LinkKind.PCIE, 0, 1)]


def test_fitting_the_samples_names_the_pattern_no_line_fits() -> None:
    from taccl_py.runtime.measure.profile import PatternSamples, ProfileSamples, fit_profile, measured_topology

    grows = tuple((t, t * 1.1) for t in _line(400.0, 1.0))
    pair = PatternSamples("lone pair", ((0, 1),), tuple((t,) for t in _line(50.0, 3.0)))
    ring = PatternSamples("ring shift", ((0, 1), (1, 2), (2, 3), (3, 0)), grows)
    outcome = fit_profile(ProfileSamples(PROVENANCE, None, (pair, ring)))
    assert outcome.host.pair.alpha_us == pytest.approx(50.0)
    assert outcome.host.ring.repeat_spread == pytest.approx(0.05 / 1.05)  # IQR of (t, 1.1t) over its median
    assert measured_topology(outcome).name == "measured"
    shrinks = replace(ring, samples_us=tuple(reversed(grows)))
    with pytest.raises(ArgumentError, match="^ring shift: sizes: times do not grow with size"):
        fit_profile(ProfileSamples(PROVENANCE, None, (pair, shrinks)))
    nvlink = PatternSamples("nvlink", ((0, 1),), tuple((t,) for t in _line(2.0, 20.0)))
    classes = fit_profile(ProfileSamples(PROVENANCE, "ndv2", (nvlink,)))
    assert [(c.kind, c.src, c.dst) for c in classes.classes] == [(LinkKind.NVLINK, 0, 1)]
    assert route(measured_topology(classes, "ndv2"), 0, 1).bandwidth_GBps == pytest.approx(20.0)


def _scattered_samples(sizes: tuple[int, ...]):
    """Return a host profile whose lone pair's repeats scatter (spread 250%) and whose ring shift is clean."""
    from taccl_py.runtime.measure.profile import PatternSamples, ProfileSamples

    line = [50.0 + size / 3e3 for size in sizes]
    pair = PatternSamples("lone pair", ((0, 1),), tuple((t, t, 6 * t) for t in line))
    ring = PatternSamples("ring shift", ((0, 1), (1, 0)), tuple((t, t, t) for t in line))
    provenance = ProfileProvenance("0.1.0", "gloo", 2, "cpu", sizes, 3, 1, 1, "2026-11-27")
    return ProfileSamples(provenance, None, (pair, ring))


def test_a_fit_past_the_trusted_residual_or_spread_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    from taccl_py.runtime.measure.profile import fit_profile

    with caplog.at_level("WARNING", logger="taccl_py.runtime.measure.profile"):
        fit_profile(_scattered_samples(SIZES))
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith("profile: lone pair: repeat spread 250% (over 100%); the fitted alpha")
    samples = _scattered_samples(SIZES)
    bent = tuple((t * (1 + 2 * (i % 2)),) for i, t in enumerate(_line(50.0, 3.0)))  # every other size 3x slower
    clean = tuple((t,) for t in _line(50.0, 3.0))
    both_bent = tuple(replace(pattern, samples_us=bent) for pattern in samples.patterns)
    warned: list[str] = []
    fit_profile(replace(samples, patterns=both_bent), warn=warned.append)
    assert len(warned) == 1 and warned[0].count("fit max residual") == 2 and "(over 50%)" in warned[0]
    caplog.clear()
    both_clean = tuple(replace(pattern, samples_us=clean) for pattern in samples.patterns)
    fit_profile(replace(samples, patterns=both_clean), warn=warned.append)
    assert len(warned) == 1 and caplog.records == []


def test_profile_warns_in_one_line_and_prints_default_sizes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the runtime extra)")
    import taccl_py.runtime.measure.profile as profile

    # as under torchrun, rank 0 of 2, with the measurement replaced by times of a loaded machine
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(profile, "run_profile", lambda spec: _scattered_samples(spec.sizes))
    out = tmp_path / "m.json"
    assert main(["profile", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "warning: profile: lone pair: repeat spread 250% (over 100%); the fitted alpha and bandwidth may be off "
        "as much: profile an idle machine or time more repeats"
    ]
    assert captured.out.splitlines()[-1].endswith("sizes 4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,32MiB")
    assert read_topology(out).num_ranks == 2
