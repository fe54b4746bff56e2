"""helpers.doctor (the command): the report's documented shape, the printed checks, the exit status,
and a real run on this machine."""

import json

from helpers import doctor
from helpers.doctor import checks


def test_run_writes_the_documented_report_and_prints_every_check(tmp_path, fake_facts):
    found = checks.judge(fake_facts())
    assert doctor.exit_status(found) == 0
    assert doctor.exit_status(checks.judge(fake_facts(memory={"available": 2**28, "total": 2**30}))) == 1
    found, payload, path = doctor.run(tmp_path / "doctor.json", facts=fake_facts())
    saved = json.loads(path.read_text())
    assert set(saved) >= {"version", "fingerprint", "checks"} and saved["version"] == doctor.DOCTOR_VERSION
    assert saved["fingerprint"]["cpu_model"] == "Fake CPU" and len(saved["fingerprint"]["machine_id"]) == 16
    assert all(set(c) == {"name", "status", "message", "fix"} and c["status"] in doctor.STATUSES
               for c in saved["checks"])
    text = doctor.format_checks(found)
    assert "[WARN] mpirun" in text and "fix: Debian" in text and text.splitlines()[-1] == f"{len(found) - 3} ok, 3 warning(s), 0 failure(s)"


def test_real_doctor_run(tmp_path, capsys):
    code = doctor.main(["--out", str(tmp_path / "doctor.json"), "--no-imports", "--parity-steps", "2"])
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "doctor.json").read_text())
    assert code == doctor.exit_status([doctor.Check(**c) for c in saved["checks"]])
    assert code == 0  # the machine that runs the tests can run the course
    for name in ("python", "pins", "torch build", "cpu", "instruction sets", "openmp", "c++ compiler", "platform",
                 "ipex", "memory", "disk"):
        assert any(c["name"] == name for c in saved["checks"]), name
        assert f"] {name}" in out
    from helpers import system

    assert saved["fingerprint"]["physical_cores"] == system.topology().physical_cores and "wrote" in out
