"""helpers.course.reproduce: every chapter headless into a run folder -- report, resume, failures, the lock."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from helpers.course import reproduce

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from ``tmp_path`` (the runs go to its ./results); the child processes still import helpers."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return tmp_path


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
    with pytest.raises(ValueError, match="COURSE_PROFILE=smoke RESUME="):
        state["finished"] = False
        (run / "state.json").write_text(json.dumps(state))
        reproduce.run("workshop", root=tmp_path / "r", notebooks=nbs, resume=str(run))


def exit_code(argv):
    with pytest.raises(SystemExit) as info:
        reproduce.main(argv)
    return info.value.code


def test_a_failed_chapter_exits_1_names_its_notebook_and_the_command_that_runs_it_again(tmp_path, capsys,
                                                                                       in_tmp):
    nbs, good = make_notebooks(tmp_path / "nbs", fail=True), make_notebooks(tmp_path / "good")
    (nbs / "01_alpha.ipynb").write_bytes((nbs / "02_beta.ipynb").read_bytes())  # the first chapter fails
    (nbs / "02_beta.ipynb").write_bytes((good / "02_beta.ipynb").read_bytes())
    assert exit_code(["--profile", "smoke", "--notebooks", str(nbs)]) == 1
    run = next((tmp_path / "results").iterdir())
    state = json.loads((run / "state.json").read_text())
    assert state["results"]["01_alpha"] == {**state["results"]["01_alpha"], "status": "failed", "error": "ValueError: boom"}
    assert state["results"]["02_beta"]["status"] == "done" and state["finished"]  # the rest still ran
    assert "**Failed:** ValueError: boom (see `notebooks/01_alpha.ipynb` and `logs/01_alpha.log`)" in (
        run / "report.md").read_text()
    *_, failed, again = capsys.readouterr().out.strip().splitlines()  # the summary ends the output
    assert failed == (f"FAILED 01_alpha: ValueError: boom -- log: {run}/logs/01_alpha.log -- "
                      f"notebook: {run}/notebooks/01_alpha.ipynb")
    assert again == ("1 of 2 chapter(s) failed; run only those again with "
                     f"{reproduce.resume_command('smoke', run)}") and f"RESUME={run} make reproduce" in again
    (nbs / "01_alpha.ipynb").write_bytes((good / "01_alpha.ipynb").read_bytes())  # mended: the command runs it alone
    assert exit_code(["--profile", "smoke", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "1 chapter(s) done, 1 to run" in out and "[1/1] 01_alpha" in out and "FAILED" not in out
    assert json.loads((run / "state.json").read_text())["results"]["01_alpha"]["status"] == "done"


def test_summary_and_resume_command(tmp_path):
    state = {"profile": "smoke", "chapters": ["01_a", "02_b", "03_c"],
             "results": {"01_a": {"status": "failed", "error": "RuntimeError: x"}, "02_b": {"status": "done"}}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    lines = reproduce.summary(tmp_path)
    assert lines[0] == (f"FAILED 01_a: RuntimeError: x -- log: {tmp_path}/logs/01_a.log -- "
                        f"notebook: {tmp_path}/notebooks/01_a.ipynb")
    assert len(lines) == 2 and lines[1].startswith("1 of 3 chapter(s) failed")
    state["results"]["01_a"]["status"] = "done"
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert reproduce.summary(tmp_path) == []
    assert reproduce.resume_command("full", "/a b") == ("`COURSE_PROFILE=full RESUME='/a b' make reproduce` "
                                                        "(or `python -m helpers.course.reproduce --profile full --resume '/a b'`)")


def test_bad_input_exits_2_and_makes_nothing(tmp_path, capsys, in_tmp):
    nbs = make_notebooks(tmp_path / "nbs")
    out = ["--profile", "smoke"]
    assert exit_code(out + ["--notebooks", str(nbs), "--chapters", "7"]) == 2
    assert "no notebook for chapter(s) 07" in capsys.readouterr().err
    assert exit_code(out + ["--notebooks", str(tmp_path)]) == 2
    assert "no chapter notebooks in" in capsys.readouterr().err
    assert exit_code(out + ["--resume", "latest"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
    with pytest.raises(SystemExit) as info:
        reproduce.main(out + ["--profile", "huge"])  # argparse's own usage error
    assert info.value.code == 2
    with pytest.raises(ValueError, match="COURSE_PROFILE='huge' is not a known profile"):
        reproduce.run("huge", root=tmp_path / "r")


def held_run(tmp_path, profile="smoke"):
    """A run folder whose one chapter is done (resuming it runs no kernel)."""
    folder = tmp_path / "r" / "20300101-000000-smoke"
    folder.mkdir(parents=True)
    state = {"profile": profile, "data": "data=standin", "started": "2030-01-01T00:00", "machine": {},
             "chapters": ["01_alpha"], "notebooks": str(tmp_path), "finished": False,
             "results": {"01_alpha": {"status": "done", "seconds": 1.0}}}
    (folder / "state.json").write_text(json.dumps(state))
    return folder


def test_a_second_reproduce_on_a_held_folder_is_refused_at_once_naming_the_holder(tmp_path):
    import subprocess
    import sys
    import time

    from test_locks import ROOT, start_holder

    folder = held_run(tmp_path)
    holder = start_holder(folder / reproduce.LOCK)  # a stand-in for the first reproduce: no torch
    try:
        start = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "helpers.course.reproduce", "--profile", "smoke", "--resume",
                                 str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert time.monotonic() - start < 3, "the second reproduce was not refused within 3 s"
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert second.returncode == 2, second.stderr
    assert f"error: the run folder {folder} is in use by process {holder.pid} (`" in second.stderr
    assert not json.loads((folder / "state.json").read_text())["finished"]  # the refused run wrote nothing


def test_a_run_folder_whose_reproduce_was_killed_is_taken_over(tmp_path, capsys):
    import os
    import signal

    from test_locks import start_holder

    folder = held_run(tmp_path)
    holder = start_holder(folder / reproduce.LOCK)
    os.kill(holder.pid, signal.SIGKILL)  # as a power cut or `kill -9` would leave it
    holder.wait(10)
    holder.stdin.close()
    holder.stdout.close()
    assert reproduce.run("smoke", root=tmp_path / "r", resume="latest") == folder
    assert re.search(rf"^note: the run folder {folder}: took over the lock of process {holder.pid} \(`.*`\), "
                     "which is no longer running$", capsys.readouterr().err, re.M)
    assert json.loads((folder / "state.json").read_text())["finished"]


def test_importing_reproduce_loads_no_torch():
    import subprocess
    import sys

    from test_locks import ROOT

    code = "import sys; from helpers.course import reproduce; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_missing_hardware_is_named(monkeypatch):
    assert reproduce.missing_hardware("01") is None
    monkeypatch.setattr("helpers.devices.is_available", lambda kind: kind == "cuda")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert reproduce.missing_hardware("10") == ("needs 2 or more CUDA GPUs: not measured on this machine; "
                                                "published numbers shown")
    assert reproduce.missing_hardware("12").startswith("needs an Intel Arc GPU (xpu): every measurement ran on")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert reproduce.missing_hardware("10") is None


def test_real_data_missing_fails_before_any_chapter(tmp_path, monkeypatch, capsys, in_tmp):
    from helpers import data

    def offline(name, train=True, source=None, **kwargs):
        raise data.DatasetUnavailableError(f"no {name}: run with COURSE_DATA=standin")

    monkeypatch.setattr("helpers.data.load_dataset", offline)
    monkeypatch.setenv("COURSE_DATA", "real")
    nbs = make_notebooks(tmp_path / "nbs")
    with pytest.raises(SystemExit) as info:
        reproduce.main(["--profile", "workshop", "--chapters", "1", "--notebooks", str(nbs)])
    assert info.value.code == 2
    assert re.search(r"^error: no \w+: run with COURSE_DATA=standin$", capsys.readouterr().err, re.M)
    assert not (tmp_path / "results").exists()  # nothing half-made


def test_failure_reason_is_one_clean_line():
    exc = RuntimeError("Traceback...\n\x1b[31mDatasetUnavailableError\x1b[39m: get the data\n")
    assert reproduce.failure_reason(exc) == "RuntimeError: DatasetUnavailableError: get the data"
    assert reproduce.failure_reason(reproduce.NotebookError("cell 3\nValueError: boom")) == "ValueError: boom"


def test_ctrl_c_stops_the_run_and_resume_finishes_it(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    nbs = make_notebooks(tmp_path / "nbs")
    slow = nbformat.read(nbs / "02_beta.ipynb", as_version=4)
    started = tmp_path / "started"
    slow.cells.append(nbformat.v4.new_code_cell(f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); "
                                                "time.sleep(60)"))
    nbformat.write(slow, nbs / "02_beta.ipynb")
    cmd = [sys.executable, "-m", "helpers.course.reproduce", "--profile", "smoke", "--notebooks", str(nbs)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}   # run from tmp_path (its ./results), helpers importable
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and not started.exists():  # the second chapter's kernel is in its last cell
        time.sleep(0.1)
    assert started.exists(), "the second chapter never reached its slow cell"
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
    out, _ = proc.communicate(timeout=60)
    run = next((tmp_path / "results").iterdir())
    assert proc.returncode == 130 and "interrupted during 02_beta" in out, out
    assert f"continue with {reproduce.resume_command('smoke', run)}" in out
    state = json.loads((run / "state.json").read_text())
    assert not state["finished"] and list(state["results"]) == ["01_alpha"]  # 02 not marked failed or done
    slow.cells.pop()
    nbformat.write(slow, nbs / "02_beta.ipynb")
    assert reproduce.run("smoke", root=tmp_path / "results", resume="latest") == run
    state = json.loads((run / "state.json").read_text())
    assert state["finished"] and state["results"]["02_beta"]["status"] == "done"


def test_rows_land_in_the_run_folder_and_render_the_report(monkeypatch, reproduce_cell):
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    monkeypatch.setenv("COURSE_PROFILE", "workshop")
    monkeypatch.delenv("COURSE_DATA", raising=False)
    run = reproduce_cell(
        "import os\nfrom helpers import results\n"
        "print(os.environ['COURSE_RESULTS'])\n"
        "fp = {'cpu_model': 'x', 'machine_id': 'abc'}\n"
        "results.append_rows(results.make_rows('01', 'batch', {'b32': [2.0, 2.1, 1.9], 'b256': [1.0, 1.1, 0.9]},"
        " metric='epoch_time', unit='s', baseline='b32', fingerprint=fp))\n"
        "results.append_rows(results.make_rows('01', 'batch', {'b32': [81.0], 'b256': [79.0]}, metric='accuracy',"
        " unit='%', baseline='b32', lower_is_better=False, fingerprint=fp))", "rows", others=("00_setup_check.ipynb",))
    state = json.loads((run / "state.json").read_text())
    assert state["chapters"] == ["01_rows"]  # the setup check is not a chapter to reproduce
    rows = results_of(run)
    assert [r.profile for r in rows] == ["smoke"] * 4 and {r.data for r in rows} == {"standin"}
    report = (run / "report.md").read_text()
    assert "epoch_time median (s per epoch)" in report and "ratio vs b32 (x)" in report
    assert "81.00 (stand-in)" in report and "79.00 (stand-in)" in report
    assert (run / "rows.csv").read_text().startswith("chapter,experiment,variant")


def results_of(run):
    from helpers import results

    return results.read_rows(run / results.ROWS_FILE)


def test_resume_latest_after_a_smoke_run_names_the_profile(tmp_path, in_tmp):
    nbs = make_notebooks(tmp_path / "nbs")
    run = reproduce.run("smoke", notebooks=nbs, chapters=["1"])
    state = json.loads((run / "state.json").read_text())
    state["finished"] = False
    (run / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="COURSE_PROFILE=smoke RESUME=latest make reproduce"):
        reproduce.run("workshop", notebooks=nbs, resume="latest")
    with pytest.raises(SystemExit) as info:
        reproduce.main(["--profile", "WORKSHOP", "--resume", "latest"])
    assert info.value.code == 2


def test_no_private_nbclient_api():
    import inspect

    assert "_async_cleanup_kernel_future" not in inspect.getsource(reproduce)


def test_extract_takes_the_report_section_tagged_cells_and_every_figure(tmp_path):
    import base64

    png = b"\x89PNG\r\n\x1a\nfake image bytes"
    nb = nbformat.v4.new_notebook()
    figure = nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode(),
                                                           "text/plain": "<Figure>"})
    tagged = nbformat.v4.new_code_cell("t", outputs=[nbformat.v4.new_output("stream", name="stdout", text="tagged\n")])
    tagged.metadata["tags"] = ["report"]
    nb.cells = [
        nbformat.v4.new_code_cell("a", outputs=[nbformat.v4.new_output("stream", name="stdout", text="setup\n"),
                                                figure]),
        tagged,
        nbformat.v4.new_markdown_cell("## Published vs yours\nThe comparison."),
        nbformat.v4.new_code_cell("b", outputs=[
            nbformat.v4.new_output("execute_result", data={"text/markdown": "| a | b |", "text/plain": "x"}),
            nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
            nbformat.v4.new_output("stream", name="stdout", text="ratio 1.5x\n"), figure]),
        nbformat.v4.new_markdown_cell("## Exercises"),
        nbformat.v4.new_code_cell("c", outputs=[nbformat.v4.new_output("stream", name="stdout", text="after\n")]),
    ]
    executed = tmp_path / "05_x.ipynb"
    nbformat.write(nb, executed)
    (tmp_path / "figures").mkdir()
    tables, images = reproduce.extract(executed, tmp_path / "figures")
    assert tables == ["```\ntagged\n```", "| a | b |", "```\nratio 1.5x\n```"]  # no stderr, nothing outside
    assert images == ["05_x-1.png", "05_x-2.png"]  # every figure, in or out of the section
    assert (tmp_path / "figures" / "05_x-2.png").read_bytes() == png


def test_write_report_per_chapter_status_rows_and_figures(tmp_path):
    from helpers import results

    rows = results.make_rows("01", "toy", {"a": [2.0, 2.0], "b": [1.0, 1.0]}, metric="call_time", unit="s",
                             baseline="a", fingerprint={"cpu_model": "x"}, profile="smoke", data="none")
    for chapter in ("09", "04"):  # not in this run's list; in it, not run yet (an interrupted chapter's rows)
        rows += results.make_rows(chapter, "extra", {"c": [1.0]}, metric="t", unit="s", fingerprint={},
                                  profile="smoke", data="none")
    results.write_rows(rows, tmp_path / results.ROWS_FILE)
    state = {"profile": "smoke", "started": "2030-01-01T00:00", "finished": False, "data": "data=standin",
             "machine": {"cpu_model": "Test CPU"},
             "chapters": ["01_toy", "02_printed", "03_failed", "10_multi_gpu", "04_later"],
             "results": {"01_toy": {"status": "done", "seconds": 12.4, "figures": ["01_toy-1.png"]},
                         "02_printed": {"status": "done", "seconds": 3.0, "tables": ["```\nratio 1.5x\n```"]},
                         "03_failed": {"status": "failed", "error": "ValueError: boom", "seconds": 2.0},
                         "10_multi_gpu": {"status": "done", "seconds": 1.0, "missing": "needs 2 or more CUDA GPUs"}}}
    path = reproduce.write_report(tmp_path, state)
    text = path.read_text()
    assert path == tmp_path / "report.md" and text.startswith("# Course measurements (smoke profile)")
    assert json.loads((tmp_path / "state.json").read_text()) == state   # written with the report
    assert "Started 2030-01-01T00:00; in progress. data=standin" in text and '"cpu_model": "Test CPU"' in text
    toy = text.split("## 01_toy")[1].split("## 02_printed")[0]
    assert "Ran in 12 s." in toy and "### 01 / toy: call_time" in toy and "![01_toy-1.png](figures/01_toy-1.png)" in toy
    assert "*This chapter wrote no result rows; its notebook printed:*" in text and "ratio 1.5x" in text
    assert "**Failed:** ValueError: boom" in text and "*Not run yet.*" in text.split("## 04_later")[1]
    assert "*Chapter 10 needs 2 or more CUDA GPUs.*" in text
    other = text.split("## Other rows\n")[1]
    assert "### 04 / extra: t" in other and "### 09 / extra: t" in other and "### 01" not in other
    assert (tmp_path / "rows.csv").read_text().count("\n") == 5  # header and one line per row


def test_chapter_notebooks_leave_out_the_setup_check_unless_named(tmp_path):
    for name in ("00_setup", "01_a", "02_b"):
        nbformat.write(nbformat.v4.new_notebook(), tmp_path / f"{name}.ipynb")
    assert [p.name for p in reproduce.chapter_notebooks(tmp_path)] == ["01_a.ipynb", "02_b.ipynb"]
    assert [p.name for p in reproduce.chapter_notebooks(tmp_path, ["0", "2"])] == ["00_setup.ipynb", "02_b.ipynb"]
    with pytest.raises(ValueError, match="no notebook for chapter"):
        reproduce.chapter_notebooks(tmp_path, ["7"])
