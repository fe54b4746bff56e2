import json

import nbformat
import pytest

from helpers import reproduce


def make_notebooks(folder, fail=False):
    folder.mkdir()
    for name, code in [("01_alpha", "print('measured 1.5x')"), ("02_beta", "raise ValueError('boom')" if fail else "x = 2")]:
        nb = nbformat.v4.new_notebook()
        tagged = nbformat.v4.new_code_cell("print('tagged table')")
        tagged.metadata["tags"] = ["report"]
        nb.cells = [nbformat.v4.new_code_cell("import os; print(os.environ['COURSE_PROFILE'])"),
                    nbformat.v4.new_code_cell("import os; os.write(2, b'kernel noise'); print('untagged')"),
                    tagged,
                    nbformat.v4.new_markdown_cell("## Published vs yours"),
                    nbformat.v4.new_code_cell(code)]
        nbformat.write(nb, folder / f"{name}.ipynb")
    return folder


def test_run_report_and_resume(tmp_path, capsys):
    nbs = make_notebooks(tmp_path / "nbs")
    run = reproduce.run("smoke", root=tmp_path / "results", notebooks=nbs, chapters=["1"])
    state = json.loads((run / "state.json").read_text())
    assert state["finished"] and state["chapters"] == ["01_alpha"]
    report = (run / "report.md").read_text()
    assert "## 01_alpha" in report and "measured 1.5x" in report and "smoke profile" in report
    assert "data=standin" in report
    assert "tagged table" in report and "untagged" not in report  # section + tagged cells only
    assert (run / "notebooks" / "01_alpha.ipynb").exists()
    assert "kernel noise" in (run / "logs" / "01_alpha.log").read_text()  # the kernel's own stderr is kept
    assert "kernel noise" not in report
    second = reproduce.run("smoke", root=tmp_path / "results", notebooks=nbs)
    assert second != run and run.exists()  # a new folder: the earlier report is kept
    assert "[1/2]" in capsys.readouterr().out


def test_resume_skips_finished_chapters(tmp_path, capsys):
    nbs = make_notebooks(tmp_path / "nbs")
    run = reproduce.run("smoke", root=tmp_path / "r", notebooks=nbs)
    state = json.loads((run / "state.json").read_text())
    state["finished"] = False
    state["results"].pop("02_beta")
    (run / "state.json").write_text(json.dumps(state))
    capsys.readouterr()
    again = reproduce.run("smoke", root=tmp_path / "r", notebooks=nbs, resume="latest")
    out = capsys.readouterr().out
    assert again == run and "1 chapter(s) done, 1 to run" in out and "02_beta" in out and "01_alpha" not in out
    with pytest.raises(ValueError, match="profile 'smoke'"):
        state["finished"] = False
        (run / "state.json").write_text(json.dumps(state))
        reproduce.run("workshop", root=tmp_path / "r", notebooks=nbs, resume=str(run))


def test_failures_and_bad_input(tmp_path):
    nbs = make_notebooks(tmp_path / "nbs", fail=True)
    run = reproduce.run("smoke", root=tmp_path / "r", notebooks=nbs)
    state = json.loads((run / "state.json").read_text())
    assert state["results"]["02_beta"]["status"] == "failed" and "boom" in state["results"]["02_beta"]["error"]
    assert "**Failed:**" in (run / "report.md").read_text()
    with pytest.raises(ValueError, match="no notebook for chapter"):
        reproduce.chapter_notebooks(nbs, ["7"])
    with pytest.raises(ValueError, match="nothing to resume"):
        reproduce.run("smoke", root=tmp_path / "empty", notebooks=nbs, resume="latest")


def test_missing_hardware_is_named():
    assert reproduce.missing_hardware("01") is None
    msg = reproduce.missing_hardware("10")
    assert msg is None or "CUDA" in msg
    assert "published numbers" in reproduce.missing_consequence("10")
    assert "benchmark ran" in reproduce.missing_consequence("12")
    assert reproduce.missing_consequence("01") == "not measured on this machine"


def test_real_data_missing_fails_before_any_chapter(tmp_path, monkeypatch, capsys):
    from helpers import data

    def offline(name, train=True, source=None, **kwargs):
        raise data.DatasetUnavailableError(f"no {name}: run with COURSE_DATA=standin")

    monkeypatch.setattr(data, "load_dataset", offline)
    monkeypatch.setenv("COURSE_DATA", "real")
    nbs = make_notebooks(tmp_path / "nbs")
    with pytest.raises(SystemExit) as info:
        reproduce.main(["--profile", "workshop", "--out", str(tmp_path / "r"), "--chapters", "1"])
    assert info.value.code == 2 and "COURSE_DATA=standin" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())  # nothing half-made
    monkeypatch.setenv("COURSE_DATA", "standin")
    assert reproduce.check_datasets() == []
    assert nbs.exists()


def test_failure_reason_is_one_clean_line():
    exc = RuntimeError("Traceback...\n\x1b[31mDatasetUnavailableError\x1b[39m: get the data\n")
    assert reproduce.failure_reason(exc) == "RuntimeError: DatasetUnavailableError: get the data"


def test_ctrl_c_stops_the_run_and_resume_finishes_it(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    nbs = make_notebooks(tmp_path / "nbs")
    slow = nbformat.read(nbs / "02_beta.ipynb", as_version=4)
    slow.cells.append(nbformat.v4.new_code_cell("import time; print('started', flush=True); time.sleep(60)"))
    nbformat.write(slow, nbs / "02_beta.ipynb")
    code = ("import sys; from pathlib import Path; from helpers import reproduce; "
            f"reproduce.run('smoke', root=Path(sys.argv[1]), notebooks=Path({str(nbs)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and not any((tmp_path / "r").glob("*/logs/02_beta.log")):
        time.sleep(0.2)
    time.sleep(3)  # the second chapter's kernel is running its cells
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "interrupted during 02_beta" in out, out
    run = next((tmp_path / "r").iterdir())
    state = json.loads((run / "state.json").read_text())
    assert not state["finished"] and list(state["results"]) == ["01_alpha"]  # 02 not marked failed or done
    slow.cells.pop()
    nbformat.write(slow, nbs / "02_beta.ipynb")
    assert reproduce.run("smoke", root=tmp_path / "r", resume="latest") == run
    state = json.loads((run / "state.json").read_text())
    assert state["finished"] and state["results"]["02_beta"]["status"] == "done"
