"""The firmware library (edge/firmware) against the Python implementation: the same output
distribution (chi-square over 10**6 draws per reading, against the exact pmf), the same
bytes (every documented vector and 10**4 random batches), profiles checked and refused,
and no sanitizer report on 10**5 mutated profiles."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2

from tests.shared.helpers import blocks, stream_of, timestamps_of
from zeal import WireError, Zeal, ZealWarning, encode_batch
from zeal._core.firmware import PROFILE_BYTES, c_header, profile_bytes
from zeal.longitudinal import grid_step, grid_values
from zeal.lorawan import encode_lorawan
from zeal.mqtt.streamconfig import config_document

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "edge" / "firmware"
DRAWS = 1_000_000
#: Three stream configurations: the wire vectors' 6-bit stream A, its 3-bit stream B
#: (exponent 58), and an 8-bit stream on another range and epsilon.
CONFIGS = {
    "6 bits": Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=6),
    "3 bits": Zeal(lower=23.5, upper=83.9, epsilon=1, exponent=58),
    "8 bits": Zeal(lower=-40, upper=125, epsilon=0.5, payload_bits=8),
}
#: What one step of each device's integer reading stands for (tenths, halves, hundredths).
UNITS = {"6 bits": 0.1, "3 bits": 0.5, "8 bits": 0.01}


def profile_of(name: str, device: str = "dev1") -> bytes:
    return profile_bytes(CONFIGS[name], stream="temps", device=device, unit=UNITS[name])


def value_of(name: str, readings: np.ndarray | list[int]) -> np.ndarray:
    """The float64 an integer reading stands for, as Python computes it: float(r) * unit."""
    return np.asarray(readings, dtype=np.int64).astype(np.float64) * np.float64(UNITS[name])


@pytest.fixture(scope="session")
def host() -> dict[str, Path]:
    """The host tool built by `make firmware` (optimized, and with ASan and UBSan)."""
    subprocess.run(["make", "-C", str(FIRMWARE)], check=True, capture_output=True)
    build = FIRMWARE / "build"
    return {"plain": build / "zeal-host", "sanitized": build / "zeal-host-sanitized"}


def run(tool: Path, *args: str, stdin: str) -> str:
    result = subprocess.run(
        [str(tool), *args], input=stdin, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == "", result.stderr[-2000:]  # a sanitizer would report here
    return result.stdout


def exact_pmf(params: Zeal, value: float) -> dict[int, float]:
    """The Python sampler's exact code distribution for one reading's value."""
    grid = params.grid_sampler
    assert grid is not None
    start = int(grid.fixed_starts(np.clip(np.array([value]), params.lower, params.upper))[0])
    runs, denominator = grid.pmf_runs(start)
    top = (1 << params.payload_bits) - 2
    return {top - q: n / denominator for first, stop, n in runs for q in range(first, stop) if n}


def chi_square_p(counts: np.ndarray, pmf: dict[int, float]) -> float:
    """p-value of the counts under the pmf; codes expected fewer than 5 times are pooled
    (in code order) so the chi-square approximation holds. A code outside the support fails
    outright (p = 0)."""
    if counts.sum() != sum(int(counts[c]) for c in pmf):
        return 0.0
    total = int(counts.sum())
    observed, expected, pool_o, pool_e = [], [], 0.0, 0.0
    for code in sorted(pmf):
        pool_o, pool_e = pool_o + counts[code], pool_e + pmf[code] * total
        if pool_e >= 5:
            observed.append(pool_o)
            expected.append(pool_e)
            pool_o = pool_e = 0.0
    if pool_e:
        observed[-1] += pool_o
        expected[-1] += pool_e
    o, e = np.array(observed), np.array(expected)
    return float(chi2.sf(((o - e) ** 2 / e).sum(), len(o) - 1))


def draw(tool: Path, profile: bytes, reading: int, n: int, bits: int, seed: int) -> np.ndarray:
    """Code counts of n draws for one reading (seeded words: the device uses its TRNG)."""
    out = run(tool, "perturb", profile.hex(), str(seed), stdin=f"{reading}\n" * n)
    return np.bincount(np.array(out.split(), dtype=np.int64), minlength=1 << bits)


def readings_of(name: str) -> list[int]:
    """Integer readings below the range (clipped to its lower end), at its upper end and
    beyond it, and three inside."""
    params, unit = CONFIGS[name], UNITS[name]
    low, high = math.floor(params.lower / unit), math.ceil(params.upper / unit)
    inside = [round(low + f * (high - low)) for f in (0.1, 0.5, 0.77)]
    return [low - 5, high + 5, *inside]


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_the_c_sampler_draws_from_the_python_samplers_exact_distribution(
    host: dict[str, Path], name: str
) -> None:
    """Readings at both ends of the range and three inside, 10**6 draws each: the C codes'
    frequencies fit the exact pmf of the value each stands for (chi-square, p > 1e-4 each,
    5 readings per stream)."""
    params = CONFIGS[name]
    for reading, value in zip(readings_of(name), value_of(name, readings_of(name)), strict=True):
        counts = draw(host["plain"], profile_of(name), reading, DRAWS, params.payload_bits, 18)
        p = chi_square_p(counts, exact_pmf(params, float(value)))
        print(f"{name}, reading {reading} ({value:g}): chi-square p = {p:.4f} over {DRAWS:,}")
        assert p > 1e-4, (name, reading, p)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_band_start_is_pythons_bit_for_bit(host: dict[str, Path], name: str) -> None:
    """The band's position, Python's float64 arithmetic done in integers on the chip, gives
    exactly Python's fixed start for 10**5 integer readings across the range and beyond
    (clipped first), and for the int32 extremes."""
    params, unit = CONFIGS[name], UNITS[name]
    grid = params.grid_sampler
    assert grid is not None
    rng = np.random.default_rng(20)
    low, high = math.floor(params.lower / unit), math.ceil(params.upper / unit)
    readings = np.concatenate(
        [
            rng.integers(low - 100, high + 100, 99_990),
            [low, high, low + 1, high - 1, 0, -1, 1, -(2**31), 2**31 - 1, (low + high) // 2],
        ]
    )
    values = np.clip(value_of(name, readings), params.lower, params.upper)
    out = run(
        host["sanitized"], "starts", profile_of(name).hex(), stdin="\n".join(map(str, readings))
    )
    assert np.array_equal(np.array(out.split(), dtype=np.int64), grid.fixed_starts(values))


def test_the_integer_binary64_arithmetic_rounds_as_ieee_754(host: dict[str, Path]) -> None:
    """The additions and multiplications the band needs, done in integers on the chip,
    equal numpy's float64 results on 2 x 10**5 random operands: normal, subnormal, near
    each other (cancellation), of both signs."""
    rng = np.random.default_rng(21)
    n = 200_000
    exponents = np.where(
        rng.random(n) < 0.2, rng.integers(0, 3, n), rng.integers(1, 2046, n)
    ).astype(np.uint64)
    mantissa = rng.integers(0, 2**52, (2, n), dtype=np.uint64)
    sign = rng.integers(0, 2, (2, n), dtype=np.uint64) << np.uint64(63)
    a = sign[0] | (exponents << np.uint64(52)) | mantissa[0]
    b = sign[1] | (rng.permutation(exponents) << np.uint64(52)) | mantissa[1]
    near = rng.random(n) < 0.3
    b[near] = a[near] ^ rng.integers(0, 2**20, int(near.sum()), dtype=np.uint64)
    b[near] ^= rng.integers(0, 2, int(near.sum()), dtype=np.uint64) << np.uint64(63)
    ops = rng.choice(["add", "mul"], n)
    lines = "".join(
        f"{o} {x:016x} {y:016x}\n" for o, x, y in zip(ops, a.tolist(), b.tolist(), strict=True)
    )
    out = run(host["sanitized"], "f64", stdin=lines).split()
    with np.errstate(all="ignore"):
        fa, fb = a.view(np.float64), b.view(np.float64)
        expected = np.where(ops == "add", fa + fb, fa * fb)
    got = np.array([int(x, 16) for x in out], dtype=np.uint64)
    finite = np.isfinite(expected)  # overflow is refused by the profile checks instead
    assert finite.sum() > 150_000
    assert np.array_equal(got[finite], expected.view(np.uint64)[finite])


def with_tables(profile: bytes, **fields: int) -> bytes:
    """The profile with some integer tables changed and its checksum made right again."""
    offsets = {"w_lo": 16, "w_hi": 24, "cells": 32, "band": 40, "top": 48}
    body = bytearray(profile[:100])
    for field, value in fields.items():
        body[offsets[field] : offsets[field] + 8] = struct.pack("<Q", value)
    return bytes(body) + struct.pack("<I", zlib.crc32(body))


@pytest.mark.slow
def test_a_deliberately_perturbed_table_fails_the_same_test(host: dict[str, Path]) -> None:
    """w_hi raised by 2 % (a realized loss of 1.0198 instead of 1): the same chi-square test
    over the same 10**6 draws rejects it, so the test above can fail."""
    params = CONFIGS["6 bits"]
    grid = params.grid_sampler
    assert grid is not None
    bad = with_tables(profile_of("6 bits"), w_hi=grid.w_hi * 102 // 100)
    reading = readings_of("6 bits")[3]
    counts = draw(host["plain"], bad, reading, DRAWS, 6, seed=18)
    p = chi_square_p(counts, exact_pmf(params, float(value_of("6 bits", [reading])[0])))
    print(f"w_hi + 2 %: chi-square p = {p:.3g}")
    assert p < 1e-4


@pytest.mark.parametrize("name", CONFIGS)
def test_the_profile_carries_the_tables_the_python_audit_measures(name: str) -> None:
    """The realized loss of the profile's tables, ln(w_hi / w_lo), is the audit's."""
    params = CONFIGS[name]
    profile = profile_of(name)
    assert len(profile) == PROFILE_BYTES
    assert zlib.crc32(profile[:100]) == struct.unpack("<I", profile[100:])[0]
    w_lo, w_hi = struct.unpack("<QQ", profile[16:32])
    report = params.audit()
    assert math.log(w_hi / w_lo) == pytest.approx(report.loss, rel=1e-12)
    assert math.log(w_hi / w_lo) == params.realized_epsilon
    assert report.within_budget()
    header = c_header(profile)
    assert header.count("0x") == PROFILE_BYTES


def test_documented_vectors_encode_byte_for_byte(host: dict[str, Path]) -> None:
    """Each vector in docs/wire-format.md, through `zeal-host encode` (both builds)."""
    vectors = blocks("vector")
    assert len(vectors) >= 5
    for tool in host.values():
        for v in vectors:
            params = stream_of(v["params"])
            profile = profile_bytes(params, stream=v["stream"], device=v["device"], unit=1)
            lines = "".join(
                f"{t} {c}\n"
                for t, c in zip(timestamps_of(v["timestamps"]), v["codes"].split(), strict=True)
            )
            assert (
                run(tool, "encode", profile.hex(), v["sequence"], stdin=lines).strip() == v["hex"]
            ), v["name"]


@pytest.mark.parametrize("build", ["plain", "sanitized"])
def test_random_batches_encode_as_python_does(host: dict[str, Path], build: str) -> None:
    """10**4 random batches per build: periodic and irregular timestamps, sequences up to
    2**64 - 1, every code of the range; plus batches Python refuses, which C refuses too."""
    rng = np.random.default_rng(18)
    params = CONFIGS["8 bits"]
    lines, expected = [], []
    for i in range(10_000):
        count = int(rng.integers(1, 200)) if i % 100 else int(rng.integers(1, 65_536))
        base = int(rng.integers(0, 1 << 47))
        if rng.random() < 0.5:
            stamps = base + int(rng.integers(0, 100_000)) * np.arange(count)
        else:
            stamps = base + np.cumsum(rng.integers(0, 1 << int(rng.integers(1, 40)), count))
        codes = rng.integers(params.code_min, params.code_max + 1, count)
        if i % 50 == 1:  # a code outside the range
            codes[int(rng.integers(0, count))] = params.code_max + 1
        if i % 50 == 2 and count > 1:  # a timestamp going back
            stamps[-1] = stamps[0] - 1
        sequence = int(rng.integers(0, 1 << 63)) * 2 + int(rng.integers(0, 2))
        lines.append(
            f"{sequence} {count} {' '.join(map(str, stamps))} {' '.join(map(str, codes))}\n"
        )
        try:
            payload = encode_batch(
                params, stream="temps", device="dev1", sequence=sequence, timestamps=stamps,
                codes=codes,
            )  # fmt: skip
            expected.append(payload.hex())
        except WireError as exc:
            expected.append({"bad_code": "error -9", "bad_timestamp": "error -8"}[exc.reason])
    profile = profile_of("8 bits").hex()
    got = run(host[build], "batches", profile, stdin="".join(lines)).splitlines()
    assert len(got) == len(expected)
    mismatches = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert mismatches == []
    assert sum(e.startswith("error") for e in expected) >= 300  # the refusals were exercised


def test_documented_lorawan_vectors_encode_byte_for_byte(host: dict[str, Path]) -> None:
    """Each LoRaWAN vector in docs/wire-format.md, through zeal_encode_lorawan (both
    builds)."""
    vectors = blocks("lorawan")
    assert len(vectors) >= 4
    for tool in host.values():
        for v in vectors:
            params = stream_of(v["params"])
            profile = profile_bytes(params, stream="temps", device=v["device"], unit=1)
            codes = v["codes"].split()
            line = f"{v['spacing']} {len(codes)} {' '.join(codes)}\n"
            assert run(tool, "lorawan", profile.hex(), stdin=line).strip() == v["hex"], v["name"]


@pytest.mark.parametrize("build", ["plain", "sanitized"])
def test_random_lorawan_uplinks_encode_as_python_does(host: dict[str, Path], build: str) -> None:
    """10**4 random uplinks per build, 1 to 400 readings at any spacing of a uint32: the
    same FRMPayload as zeal.lorawan, and the same refusals (a code out of range, more than
    242 bytes)."""
    rng = np.random.default_rng(38)
    params = CONFIGS["6 bits"]
    lines, expected = [], []
    for i in range(10_000):
        count = int(rng.integers(1, 16)) if i % 3 else int(rng.integers(1, 400))
        spacing = int(rng.integers(0, 1 << int(rng.integers(1, 33))))
        codes = rng.integers(params.code_min, params.code_max + 1, count)
        if i % 50 == 1:  # a code outside the range
            codes[int(rng.integers(0, count))] = params.code_min - 1
        lines.append(f"{spacing} {count} {' '.join(map(str, codes))}\n")
        try:
            payload = encode_lorawan(
                params, stream="temps", device="dev1", codes=codes, spacing_seconds=spacing
            )
            expected.append(payload.hex())
        except WireError as exc:
            expected.append({"bad_code": "error -9", "too_large": "error -12"}[exc.reason])
    got = run(host[build], "lorawan", profile_of("6 bits").hex(), stdin="".join(lines))
    assert len(got.splitlines()) == len(expected)
    mismatches = [
        i for i, (a, b) in enumerate(zip(got.splitlines(), expected, strict=True)) if a != b
    ]
    assert mismatches == []
    assert sum(e == "error -12" for e in expected) >= 300
    assert sum(e == "error -9" for e in expected) >= 100


def test_profiles_are_checked_and_bad_ones_refused(host: dict[str, Path]) -> None:
    """Each check of zeal_profile_load gives its own error; the Python side refuses streams
    the firmware cannot run."""
    good = profile_of("6 bits")
    grid = CONFIGS["6 bits"].grid_sampler
    assert grid is not None
    cases = {
        good.hex(): "0",
        good[:-1].hex(): "-1",
        (b"ZG" + good[2:]).hex(): "-2",
        (good[:2] + b"\x02" + good[3:]).hex(): "-3",
        (good[:60] + bytes([good[60] ^ 1]) + good[61:]).hex(): "-4",
        with_tables(good, band=grid.cells).hex(): "-5",
        with_tables(good, w_hi=grid.w_lo).hex(): "-5",
        with_tables(good, w_lo=1 << 62, cells=4).hex(): "-5",
        "zz": "-1",
    }
    got = run(host["sanitized"], "profiles", stdin="".join(f"{h}\n" for h in cases)).split()
    assert got == list(cases.values())
    with pytest.warns(ZealWarning):
        paper = Zeal(lower=0, upper=1, epsilon=1, sampler="paper")
    with pytest.raises(ValueError, match="grid sampler only"):
        profile_bytes(paper, stream="s", device="d", unit=1)
    with pytest.raises(ValueError, match="reading unit"):
        profile_bytes(CONFIGS["6 bits"], stream="s", device="d", unit=0.0)


def test_mutated_profiles_never_trip_a_sanitizer(host: dict[str, Path]) -> None:
    """10**5 mutated profiles (random bytes changed, half with the checksum made right so
    the table checks are reached) through the ASan/UBSan build: each is refused or, if
    accepted, perturbs six readings and encodes them; no sanitizer report, no crash."""
    rng = np.random.default_rng(19)
    good = [profile_of(name) for name in CONFIGS]
    lines = []
    for i in range(100_000):
        blob = bytearray(good[i % 3])
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, 100))
            blob[at] = (
                int(rng.integers(0, 256))
                if rng.random() < 0.5
                else blob[at] ^ (1 << int(rng.integers(0, 8)))
            )
        if i % 2:
            blob[100:] = struct.pack("<I", zlib.crc32(bytes(blob[:100])))
        lines.append(blob.hex() + "\n")
    got = run(host["sanitized"], "profiles", stdin="".join(lines)).split()
    assert len(got) == len(lines)
    outcomes = {code: got.count(code) for code in set(got)}
    print(f"mutated profiles: {outcomes}")
    assert outcomes.get("-4", 0) >= 45_000  # unfixed checksums are caught
    assert outcomes.get("-5", 0) > 0  # the table checks were reached
    assert outcomes.get("0", 0) > 0  # and accepted profiles ran the sampler and encoder


def test_the_command_line_makes_a_devices_profile_from_the_streams_configuration(
    tmp_path: Path,
) -> None:
    """`python -m zeal firmware-profile --config FILE --device NAME` (hex, or a C header);
    a bad device name is refused with the reason and exit status 2."""
    params = CONFIGS["6 bits"]
    config = tmp_path / "params.json"
    config.write_text(json.dumps(config_document("temps", params)))
    command = [sys.executable, "-m", "zeal", "firmware-profile", "--config", str(config)]
    command += ["--reading-unit", "0.1"]
    out = subprocess.run(
        [*command, "--device", "dev1"], capture_output=True, text=True, check=True
    ).stdout
    assert out == profile_of("6 bits").hex() + "\n"
    header = subprocess.run(
        [*command, "--device", "dev1", "--format", "header"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert header == c_header(profile_of("6 bits"))
    bad = subprocess.run([*command, "--device", "a/b"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "device" in bad.stderr
    missing = [sys.executable, "-m", "zeal", "firmware-profile", "--config", str(tmp_path / "no")]
    absent = subprocess.run(
        [*missing, "--device", "d", "--reading-unit", "0.1"], capture_output=True, text=True
    )
    assert absent.returncode == 2
    assert "cannot read the configuration" in absent.stderr


def test_on_a_cortex_m0_perturb_and_encode_fit_in_4_kb_of_flash() -> None:
    """`make m0-size` (Debian's gcc-arm-none-eabi, -mcpu=cortex-m0 -mthumb -Os): perturb and
    encode with all they pull in take at most 4 KB of flash, and a stream's state (the
    loaded profile) at most 256 B of RAM; a longitudinal stream's memo adds at most 1 KB of
    flash, and 2 B a grid value and 32 B of RAM."""
    out = subprocess.run(
        ["make", "-s", "-C", str(FIRMWARE), "m0-size"], capture_output=True, text=True, check=True
    ).stdout
    sizes = {
        int(line.split()[-1][-5]): (int(line.split()[0]), int(line.split()[2]))
        for line in out.splitlines()
        if line.strip().endswith(".elf")
    }  # USE -> (text, bss): 0 none, 1 load, 2 perturb + encode, 3 all, 4 memo + encode
    flash = {use: text - sizes[0][0] for use, (text, _) in sizes.items()}
    ram = sizes[2][1] - sizes[0][1]
    print(f"Cortex-M0 flash: load {flash[1]}, perturb + encode {flash[2]}, all {flash[3]} B, "
          f"a longitudinal stream's report + encode {flash[4]} B; RAM per stream {ram} B, "
          f"with a memo of 16 values {sizes[4][1] - sizes[0][1]} B")  # fmt: skip
    assert flash[2] <= 4096
    assert ram <= 256
    assert flash[4] - flash[2] <= 1024  # the memo's rounding and search
    assert sizes[4][1] - sizes[0][1] <= 256 + 2 * 16 + 32


def qemu_selftest(header: str) -> subprocess.CompletedProcess[str]:
    """Build the self-test with this header and run it on QEMU's micro:bit (Cortex-M0)."""
    path = FIRMWARE / "build" / "m0" / "selftest_profile.h"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header)
    subprocess.run(
        ["make", "-s", "-C", str(FIRMWARE), "m0-selftest"], capture_output=True, check=True
    )
    command = ["qemu-system-arm", "-M", "microbit", "-nographic", "-semihosting-config"]
    command += ["enable=on,target=native", "-kernel", str(path.parent / "selftest.elf")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    # QEMU writes the semihosting console to its stderr
    return subprocess.CompletedProcess(command, result.returncode, result.stdout + result.stderr)


def test_the_cortex_m0_self_test_passes_under_qemu() -> None:
    """The bare-metal self-test (semihosting) encodes a documented vector byte for byte and
    passes its own chi-square check over 20,000 draws; its counts pass the same test here.
    With w_hi raised by 50 % in its profile, its check fails (so it can)."""
    result = qemu_selftest(selftest_header(20_000))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "wire vector: same bytes" in result.stdout
    assert "distribution check passed" in result.stdout
    counts = np.zeros(64, dtype=np.int64)
    for line in result.stdout.splitlines():
        if line.startswith("code "):
            code, count = map(int, line.split()[1:])
            counts[code] = count
    assert counts.sum() == 20_000
    pmf = exact_pmf(CONFIGS["6 bits"], float(value_of("6 bits", [readings_of("6 bits")[3]])[0]))
    p = chi_square_p(counts, pmf)
    print(f"QEMU Cortex-M0 self-test: 20,000 draws, chi-square p = {p:.4f}")
    assert p > 1e-4
    grid = CONFIGS["6 bits"].grid_sampler
    assert grid is not None
    bad = qemu_selftest(selftest_header(20_000, w_hi=grid.w_hi * 3 // 2))
    assert bad.returncode == 1
    assert "distribution check FAILED" in bad.stdout


def selftest_header(draws: int, **tables: int) -> str:
    """The Cortex-M0 self-test's inputs, made here: stream A's profile for device dev1
    (unit 0.1), the documented 4-reading vector, and for one reading the chi-square bins
    (pooled as chi_square_p pools them), their probabilities in units of 2**-32, and the
    critical value at p = 1e-4, times 256."""
    params = CONFIGS["6 bits"]
    vector = next(v for v in blocks("vector") if v["name"].startswith("periodic, 4"))
    reading = readings_of("6 bits")[3]
    pmf = exact_pmf(params, float(value_of("6 bits", [reading])[0]))
    bins, bin_of, pool = [], [0xFF] * 64, 0.0
    for code in sorted(pmf):
        bin_of[code] = len(bins)
        pool += pmf[code]
        if pool * draws >= 5:
            bins.append(pool)
            pool = 0.0
    if pool:
        for code in sorted(pmf):
            bin_of[code] = min(bin_of[code], len(bins) - 1)
        bins[-1] += pool
    critical = chi2.isf(1e-4, len(bins) - 1)
    payload = bytes.fromhex(vector["hex"])

    def array(kind: str, name: str, values: list[int]) -> str:
        return f"static const {kind} {name}[{len(values)}] = {{{', '.join(map(str, values))}}};"

    return "\n".join(
        [
            "/* Generated by tests/firmware/test_firmware.py: the Cortex-M0 self-test's inputs. */",
            "#include <stdint.h>",
            array("uint8_t", "profile_blob", list(with_tables(profile_of("6 bits"), **tables))),
            f"#define SELFTEST_BITS {params.payload_bits}u",
            f"#define SELFTEST_READING {reading}",
            f"#define SELFTEST_DRAWS {draws}u",
            "#define SELFTEST_SEED 18u",
            f"#define SELFTEST_BINS {len(bins)}u",
            f"#define SELFTEST_CRITICAL_X256 {math.floor(critical * 256)}u",
            array("uint8_t", "bin_of_code", bin_of),
            array("uint32_t", "bin_probability", [round(p * 2**32) for p in bins]),
            f"#define VECTOR_SEQUENCE {vector['sequence']}u",
            array("uint64_t", "vector_stamps", timestamps_of(vector["timestamps"])),
            array("uint32_t", "vector_codes", [int(c) for c in vector["codes"].split()]),
            array("uint8_t", "vector_payload", list(payload)),
            "",
        ]
    )


def memo_pmf(params: Zeal, value: float) -> dict[int, float]:
    """The exact code distribution of a fresh memo's report of `value`: the two grid values
    around it, weighted as the offset rounds (zeal.longitudinal), each drawn exactly."""
    grid = grid_values(params)
    x = min(max(value, params.lower), params.upper)
    j = min(int(np.searchsorted(grid, x, side="right")) - 1, grid.size - 2)
    up = (x - grid[j]) / (grid[j + 1] - grid[j])
    out: dict[int, float] = {}
    for k, weight in ((j, 1 - up), (j + 1, up)):
        for code, p in exact_pmf(params, float(min(grid[k], params.upper))).items():
            out[code] = out.get(code, 0.0) + weight * p
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["6 bits", "8 bits"])
def test_the_c_memo_reports_as_pythons_longitudinal_stream(
    host: dict[str, Path], name: str
) -> None:
    """A longitudinal stream (7 grid values): 200,000 devices, each a new memo reporting one
    reading twice. The first reports' codes fit Python's distribution (the two grid values
    around the reading, weighted as the offset rounds, each drawn exactly; chi-square, p >
    1e-4), the first is a draw and the second repeats it for free."""
    params = Zeal(
        lower=CONFIGS[name].lower,
        upper=CONFIGS[name].upper,
        epsilon=CONFIGS[name].epsilon,
        payload_bits=CONFIGS[name].payload_bits,
        grid_points=7,
    )
    step = struct.unpack("<Q", struct.pack("<d", grid_step(params)))[0]
    profile = profile_bytes(params, stream="temps", device="dev1", unit=UNITS[name])
    reading = readings_of(name)[3]  # inside the range, between two grid values
    devices = 200_000
    out = run(
        host["plain"],
        "memo",
        profile.hex(),
        "7",
        f"{step:x}",
        stdin=f"new\n{reading}\n{reading}\n" * devices,
    )
    pairs = np.array(out.split(), dtype=np.int64).reshape(devices, 2, 2)
    assert (pairs[:, 0, 0] == pairs[:, 1, 0]).all()  # the repeat is the memoized code
    assert (pairs[:, 0, 1] == 1).all()
    assert (pairs[:, 1, 1] == 0).all()
    counts = np.bincount(pairs[:, 0, 0], minlength=1 << params.payload_bits)
    value = float(value_of(name, [reading])[0])
    p = chi_square_p(counts, memo_pmf(params, value))
    print(f"{name}, memo of reading {reading} ({value:g}): chi-square p = {p:.4f} over {devices:,}")
    assert p > 1e-4
    # The sanitized build over readings across and beyond the range: no report.
    sweep = "".join(f"new\n{r}\n{r}\n" for r in range(-2000, 14000, 37))
    run(host["sanitized"], "memo", profile.hex(), "7", f"{step:x}", stdin=sweep)
