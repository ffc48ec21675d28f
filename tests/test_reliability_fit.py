"""Issue 23, the ``fit`` / logs / fit-file part: ``quadjax fit`` fails in one line with the path
and the reason (exit 2) and checks ``--out`` before fitting; fit files are written atomically and
a damaged one raises ``ValueError`` naming it; rotor speeds in the wrong unit or sign are refused.

Nothing here runs a fit: every failure is meant to come before the compiled loop.
"""

import json
import os
import stat
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from quadjax import hover_rotor_speed, presets
from quadjax.cli import main
from quadjax.frames import RPM_PER_RAD_S
from quadjax.logs import FlightLog, check_rotor_speeds, load_csv, save_csv
from quadjax.params import check_params
from quadjax.sysid import fit, load_fit, load_params, nanodrone_motor_map, save_fit
from quadjax.sysid.io import check_writable
from quadjax.sysid.motor import MotorMap


def hover_log(T=40, speeds=None, name="hover"):
    """A short hover log in the generic schema's conventions (rotor speeds at hover unless given)."""
    p = presets.crazyflie21_brushless(dtype="float64")
    omega = np.tile(np.asarray(hover_rotor_speed(p)), (T, 1)) if speeds is None else speeds
    zeros = np.zeros((T, 3))
    return FlightLog(name=name, t=np.arange(T) * 0.01, position=zeros + [0, 0, 1], velocity=zeros,
                     attitude=np.tile([1.0, 0, 0, 0], (T, 1)), body_rates=zeros, rotor_speeds=omega)


@pytest.fixture
def csv_log(tmp_path):
    path = tmp_path / "flight.csv"
    save_csv(hover_log(), path)
    return path


def run_fit(capsys, *args):
    """``quadjax fit ARGS`` in-process: (exit code, stdout, stderr)."""
    code = main(["fit", "--fit", "k_f", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quadjax fit: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert str(fragment) in lines[0], (fragment, lines[0])


# --- --out is checked before any work ---------------------------------------------------------


def permission_bits_apply(tmp_path) -> bool:
    """False for root (or a process with CAP_DAC_OVERRIDE), which reads and writes regardless."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        probe.read_text()
    except PermissionError:
        return True
    finally:
        probe.unlink()
    return False


def read_only_folder(tmp_path):
    """A folder this process cannot create files in (/sys where permission bits do not apply)."""
    if permission_bits_apply(tmp_path):
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        return folder
    try:
        check_writable("/sys/probe.json")
    except ValueError:
        return Path("/sys")
    pytest.skip("no folder is read-only for this process")


@pytest.mark.parametrize("case", ["missing_folder", "is_folder", "parent_is_file", "fifo", "read_only", "empty"])
def test_fit_out_checked_before_anything_runs(tmp_path, csv_log, capsys, case):
    """An unwritable --out is one error line naming it, before the fit prints or computes anything."""
    if case == "missing_folder":
        out, why = tmp_path / "nowhere" / "fit.json", "does not exist"
    elif case == "is_folder":
        out, why = tmp_path, "is a folder"
    elif case == "parent_is_file":
        out, why = csv_log / "fit.json", "is not a folder"
    elif case == "fifo":
        out, why = tmp_path / "pipe", "not a regular file"
        os.mkfifo(out)
    elif case == "read_only":
        out, why = read_only_folder(tmp_path) / "fit.json", "cannot write in folder"
    else:
        out, why = "", "empty file name"
    t0 = time.perf_counter()
    code, stdout, err = run_fit(capsys, "--data", csv_log, "--out", out)
    elapsed = time.perf_counter() - t0
    assert_one_line_error(code, err, out if case != "empty" else "''", why)
    assert stdout == ""  # no "fitting ..." line: nothing was loaded or fitted
    assert elapsed < 5.0  # a fit compiles for tens of seconds


def test_fit_refuses_to_overwrite_a_log(csv_log, capsys):
    before = csv_log.read_bytes()
    code, _, err = run_fit(capsys, "--data", csv_log, "--out", csv_log)
    assert_one_line_error(code, err, csv_log, "one of the logs")
    assert csv_log.read_bytes() == before


# --- every other CLI failure: one line with the path and the reason --------------------------


def write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def rpm_csv(tmp_path, factor):
    """A hover log whose rotor-speed columns were written as rad/s × ``factor`` (RPM: 9.55)."""
    log = hover_log()
    log = log.replace(rotor_speeds=log.rotor_speeds * factor)
    save_csv(log, tmp_path / "rpm.csv")
    return tmp_path / "rpm.csv"


@pytest.mark.parametrize("case", [
    "missing_data", "empty_folder", "garbage_csv", "binary_csv", "ragged_csv", "missing_column",
    "negative_speeds", "erpm_speeds", "rpm_speeds", "bad_parquet", "init_not_json", "init_list",
    "validate_rpm", "init_missing", "init_bad_field", "bad_prior", "bad_weights", "bad_name",
])
def test_fit_cli_failures_are_one_line_with_path_and_reason(tmp_path, csv_log, capsys, case):
    out = tmp_path / "fit.json"
    data, extra = csv_log, []
    if case == "missing_data":
        data, fragments = tmp_path / "missing.csv", ["missing.csv", "no such file"]
    elif case == "empty_folder":
        (tmp_path / "empty").mkdir()
        data, fragments = tmp_path / "empty", ["empty", "no .parquet or .csv logs"]
    elif case == "garbage_csv":
        data = write(tmp_path / "g.csv", "t,x\n0,zero\n1,one\n2,two\n")
        fragments = [data, "could not convert"]
    elif case == "binary_csv":
        data, fragments = write(tmp_path / "b.csv", bytes(range(256)) * 4), [tmp_path / "b.csv"]
    elif case == "ragged_csv":
        text = csv_log.read_text().splitlines()
        data = write(tmp_path / "r.csv", "\n".join(text[:5] + [text[5] + ",1.0"] + text[6:]))
        fragments = [data]
    elif case == "missing_column":
        data = write(tmp_path / "m.csv", "t,x,y,z\n0,0,0,0\n0.01,0,0,0\n0.02,0,0,0\n")
        fragments = [data, "missing required column 'vx'"]
    elif case == "negative_speeds":
        log = hover_log()
        data = tmp_path / "neg.csv"
        save_csv(log.replace(rotor_speeds=log.rotor_speeds * [1, -1, 1, -1]), data)
        fragments = [data, "omega1", "down to -"]
    elif case == "erpm_speeds":
        fragments = [rpm_csv(tmp_path, 6 * RPM_PER_RAD_S), "omega0", "faster than any multirotor"]
        data = tmp_path / "rpm.csv"
    elif case == "rpm_speeds":  # within rad/s of some multirotor: caught by fit against omega_max
        fragments = ["'rpm'", "omega0", "omega_max", "rpm_to_rad_s"]
        data = rpm_csv(tmp_path, RPM_PER_RAD_S)
    elif case == "bad_parquet":
        pytest.importorskip("pandas")
        pytest.importorskip("pyarrow")
        data, fragments = write(tmp_path / "x.parquet", b"not parquet at all"), [tmp_path / "x.parquet"]
    elif case == "init_not_json":
        init = write(tmp_path / "init.json", '{"format": "quadjax.fit/1", "params": {')
        extra, fragments = ["--init", init], [init, "not JSON"]
    elif case == "init_list":
        init = write(tmp_path / "init.json", "[1, 2, 3]")
        extra, fragments = ["--init", init], [init, "not a quadjax fit file"]
    elif case == "validate_rpm":  # held-out logs are checked against the vehicle too
        extra, fragments = ["--validate", rpm_csv(tmp_path, RPM_PER_RAD_S)], ["--validate log 'rpm'", "omega_max"]
    elif case == "init_missing":
        extra, fragments = ["--init", tmp_path / "nope.json"], [tmp_path / "nope.json", "No such file"]
    elif case == "init_bad_field":
        init = tmp_path / "init.json"
        save_fit(init, presets.crazyflie21_brushless(dtype="float64"))
        doc = json.loads(init.read_text())
        doc["params"]["mass"] = {"value": 0.045}
        write(init, json.dumps(doc))
        extra, fragments = ["--init", init], [init, "QuadParams.mass", "dict"]
    elif case == "bad_prior":
        extra, fragments = ["--prior", "k_f=1"], ["--prior", "NAME=NUMBER,NUMBER"]
    elif case == "bad_weights":
        extra, fragments = ["--weights", "a,b"], ["--weights"]
    else:
        extra, fragments = ["--fit", "bogus"], ["cannot fit 'bogus'"]
    code, _, err = run_fit(capsys, "--data", data, "--out", out, *extra)
    assert_one_line_error(code, err, *fragments)
    assert not out.exists()


def test_unreadable_log_and_read_only_out_are_one_line(tmp_path, csv_log, capsys):
    if not permission_bits_apply(tmp_path):
        pytest.skip("this process reads and writes files whatever their permission bits (root)")
    out = write(tmp_path / "fit.json", "keep")
    out.chmod(stat.S_IRUSR)
    code, _, err = run_fit(capsys, "--data", csv_log, "--out", out)
    assert_one_line_error(code, err, out, "read-only")
    assert out.read_text() == "keep"
    csv_log.chmod(0)
    code, _, err = run_fit(capsys, "--data", csv_log, "--out", tmp_path / "new.json")
    assert_one_line_error(code, err, csv_log, "cannot read")


# --- atomic save -----------------------------------------------------------------------------


def crazyflie():
    return presets.crazyflie21_brushless(dtype="float64")


def test_save_fit_replaces_atomically_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "fit.json"
    save_fit(path, crazyflie())
    first = path.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["fit.json"]  # no temp or probe file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # as a plain open() would create it

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        save_fit(path, crazyflie().replace(mass=jnp.asarray(0.05)))
    assert path.read_bytes() == first  # the old file, whole
    assert sorted(os.listdir(tmp_path)) == ["fit.json"]
    monkeypatch.undo()
    save_fit(path, crazyflie().replace(mass=jnp.asarray(0.05)))
    assert float(load_params(path, dtype="float64").mass) == 0.05


def test_save_fit_refuses_bad_params_and_stores_nan_metadata_as_null(tmp_path):
    path = tmp_path / "fit.json"
    with pytest.raises(ValueError, match="QuadParams.mass"):
        save_fit(path, crazyflie().replace(mass=jnp.asarray(-1.0)))
    assert not path.exists()
    # a diverged validation error must not lose the fit at the very end
    save_fit(path, crazyflie(), validation={"fitted": {"h1": {"position": float("nan")}}},
             estimates=[{"label": "k_f", "value": 3.7e-8, "std": np.float64("inf")}])
    doc = load_fit(path, dtype="float64")
    assert doc["validation"]["fitted"]["h1"]["position"] is None and doc["estimates"][0]["std"] is None


def test_save_fit_writes_through_a_symlink(tmp_path):
    real = tmp_path / "real.json"
    save_fit(real, crazyflie())
    link = tmp_path / "link.json"
    link.symlink_to(real)
    save_fit(link, crazyflie().replace(mass=jnp.asarray(0.05)))
    assert link.is_symlink() and float(load_params(real, dtype="float64").mass) == 0.05


# --- damaged fit files ------------------------------------------------------------------------


@pytest.fixture
def fit_file(tmp_path):
    path = tmp_path / "fit.json"
    save_fit(path, crazyflie(), motor_map=nanodrone_motor_map("float64"), inputs="commands",
             estimates=[{"label": "k_f", "value": 3.7e-8, "std": 1e-10}], validation={"on": "x"},
             fit_info={"names": "k_f"})
    return path


def damage(doc, edit):
    doc = json.loads(json.dumps(doc))
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("text, fragment", [
    ("[1, 2]", "not a quadjax fit file"),
    ("3.5", "not a quadjax fit file"),
    ('"fit"', "not a quadjax fit file"),
    ("", "not JSON"),
    ('{"format": "quadjax.fit/1"}', "no 'params'"),
    ('{"format": "quadjax.fit/1", "params": [1]}', "expected an object of QuadParams fields"),
    ('{"format": "quadjax.fit/1", "params": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
def test_load_fit_top_level_damage(tmp_path, text, fragment):
    path = write(tmp_path / "bad.json", text)
    with pytest.raises(ValueError, match=fragment) as info:
        load_fit(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["params"].pop("mass"), "missing QuadParams field"),
    (lambda d: d["params"].update(mass={"v": 1}), "QuadParams.mass: expected a number"),
    (lambda d: d["params"].update(mass="0.045"), "found str"),
    (lambda d: d["params"].update(mass=True), "found bool"),
    (lambda d: d["params"].update(mass=None), "found NoneType"),
    (lambda d: d["params"].update(inertia=[[[[1e-5]]]]), "nested deeper"),
    (lambda d: d["params"].update(inertia=[[1e-5, 0], [0]]), "QuadParams.inertia"),
    (lambda d: d["params"].update(k_f=10 ** 400), "not a finite number"),
    (lambda d: d["params"].update(k_f=-1.0), "QuadParams.k_f"),
    (lambda d: d["params"].update(bogus=1.0), "unknown QuadParams field"),
    (lambda d: d.update(motor_map=[1, 2]), "motor_map"),
    (lambda d: d["motor_map"].pop("gain"), "motor_map"),
    (lambda d: d["motor_map"].update(gain={"a": 1}), "motor_map.gain"),
    (lambda d: d["motor_map"].update(gain=[1.0, 2.0]), "motor_map"),
    (lambda d: d.update(inputs=3), "'inputs': expected str"),
    (lambda d: d.update(inputs="volts"), "inputs 'volts'"),
    (lambda d: d.update(estimates={"k_f": 1}), "'estimates': expected list"),
    (lambda d: d.update(fit=[1]), "'fit': expected dict"),
])
def test_load_fit_field_damage(fit_file, edit, fragment):
    fit_file.write_text(damage(json.loads(fit_file.read_text()), edit))
    with pytest.raises(ValueError, match=fragment) as info:
        load_params(fit_file)
    assert str(fit_file) in str(info.value)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_load_fit_rejects_non_finite_numbers(fit_file, literal):
    text = fit_file.read_text()
    mass = json.dumps(json.loads(text)["params"]["mass"])
    fit_file.write_text(text.replace(f'"mass": {mass}', f'"mass": {literal}', 1))
    with pytest.raises(ValueError, match="finite") as info:
        load_params(fit_file)
    assert str(fit_file) in str(info.value)


def paths_in(doc, prefix=()):
    """Every key path of a JSON document (dict keys and list indices)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from paths_in(value, prefix + (key,))


def at(doc, path):
    for key in path[:-1]:
        doc = doc[key]
    return doc


def damaged_variants(text):
    """Damaged copies of a fit file's text: every key deleted, every value swapped for another
    JSON type or nested, and the text cut short at every 7th byte."""
    doc = json.loads(text)
    swaps = [None, True, "x", "1.5", [], {}, 0, -1.0, 1e30, lambda v: [v], lambda v: [[[v]]], lambda v: {"v": v}]
    for path in paths_in(doc):
        copy = json.loads(text)
        del at(copy, path)[path[-1]]
        yield json.dumps(copy)
        for swap in swaps:
            copy = json.loads(text)
            parent = at(copy, path)
            parent[path[-1]] = swap(parent[path[-1]]) if callable(swap) else swap
            yield json.dumps(copy)
    for k in range(0, len(text), 7):
        yield text[:k]


def test_damaged_fit_files_load_valid_or_raise_value_error_naming_the_file(fit_file):
    """Property: whatever the damage, load_fit gives params that pass check_params (and a valid
    motor map), or raises ValueError naming the file; never KeyError, TypeError, RecursionError."""
    outcomes = {"loaded": 0, "refused": 0}
    for text in damaged_variants(fit_file.read_text()):
        fit_file.write_text(text)
        try:
            doc = load_fit(fit_file, dtype="float64")
        except ValueError as err:
            assert str(fit_file) in str(err), (text[:200], err)
            outcomes["refused"] += 1
            continue
        check_params(doc["params"])
        mm = doc["motor_map"]
        assert mm is None or (isinstance(mm, MotorMap) and np.all(np.asarray(mm.gain) > 0)
                              and mm.gain.shape == (doc["params"].num_rotors,))
        outcomes["loaded"] += 1
    # optional entries deleted or harmless values swapped in load; the rest is refused
    assert outcomes["loaded"] > 50 and outcomes["refused"] > 1000, outcomes


# --- rotor speeds in the wrong sign or unit ---------------------------------------------------


def test_csv_with_negative_rotor_speeds_is_refused_but_noise_passes(tmp_path):
    log = hover_log()
    path = tmp_path / "neg.csv"
    speeds = log.rotor_speeds.copy()
    speeds[10:, 2] = -speeds[10:, 2]  # speeds signed by spin direction
    save_csv(log.replace(rotor_speeds=speeds), path)
    with pytest.raises(ValueError, match=r"omega2: rotor speeds down to -1\d{3}") as info:
        load_csv(path)
    assert str(path) in str(info.value)
    # a motor at rest with sensor noise (and a filter's small ringing) is not a unit error
    speeds = log.rotor_speeds.copy()
    speeds[:20] = [[-0.8, 0.3, -0.5, 0.0]]
    speeds[20, 1] = -0.03 * speeds[25, 1]
    save_csv(log.replace(rotor_speeds=speeds), path)
    assert load_csv(path).rotor_speeds.min() < 0


def test_csv_in_erpm_is_refused_with_the_conversion_named(tmp_path):
    path = rpm_csv(tmp_path, 6 * RPM_PER_RAD_S)  # eRPM of 6 pole pairs, as the DSHOT telemetry sends
    peak = hover_log().rotor_speeds.max() * 6 * RPM_PER_RAD_S
    with pytest.raises(ValueError) as info:
        load_csv(path)
    msg = str(info.value)
    assert str(path) in msg and "column omega0" in msg and f"{peak:.6g}" in msg
    assert "rpm_to_rad_s" in msg and "erpm_to_rad_s" in msg


def test_fit_refuses_rpm_against_omega_max_before_fitting():
    """RPM of a hovering nano drone (~16 000) could be rad/s of some tiny rotor, so loading takes it;
    fit knows the vehicle (omega_max 2320 rad/s) and refuses it before any compilation."""
    p = crazyflie()
    log = hover_log(name="flight7")
    rpm = log.replace(rotor_speeds=log.rotor_speeds * RPM_PER_RAD_S)
    check_rotor_speeds(rpm.rotor_speeds, "x")  # below the absolute limit
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        fit([log, rpm], "k_f", p, horizon=5)
    assert time.perf_counter() - t0 < 3.0
    msg = str(info.value)
    assert "'flight7'" in msg and "omega0" in msg and "omega_max (2320" in msg and "rpm_to_rad_s" in msg
    assert f"{float(rpm.rotor_speeds.max()):.6g}" in msg
    check_rotor_speeds(log.rotor_speeds, "x", omega_max=float(p.omega_max))  # rad/s passes


def test_fit_entry_checks_rotor_count_and_empty_data():
    p = crazyflie()
    log = hover_log()
    six = log.replace(rotor_speeds=np.tile(log.rotor_speeds[:, :1], (1, 6)))
    with pytest.raises(ValueError, match="rotor_speeds has 6 columns, params0 has 4 rotors"):
        fit(six, "k_f", p)
    with pytest.raises(ValueError, match="no logs"):
        fit([], "k_f", p)


def test_real_flight_with_a_spin_up_still_loads(nanodrone_dir):
    """The one flight that starts with the motors at rest (filter ringing to −9 rad/s) is accepted."""
    pytest.importorskip("pandas")
    pytest.importorskip("scipy")
    from quadjax.logs import load_nanodrone

    log = load_nanodrone(nanodrone_dir / "square_20251017_run1.parquet", window=False)
    assert log.rotor_speeds.min() < 0 < log.rotor_speeds.max() < 3000
