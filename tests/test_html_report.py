"""``xflow optimize --html FILE``: a page a user opens, checked in a real headless browser (Chromium renders it;
its screenshot is saved where the test output says): the verdict, the rewrites drawn as pictures, the timing
charts and the certificate; nothing fetched at view time; every string from the model escaped; a bad path refused
in one line with nothing written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import onnx
import pytest
from click.testing import CliRunner

from tests.test_keep_simpler import transpose_pair_model
from xflow.cli import main
from xflow.cli.html.layout import Box, layout
from xflow.errors import XflowError
from xflow.optimize import OptimizeOptions, optimize_file
from xflow.optimize.run import PageRequest

HOSTILE = '<img src=x onerror="alert(1)">&amp;'  # a node name an exporter could write


def _hostile_model() -> onnx.ModelProto:
    """The Transpose-pair model, its first Transpose named with markup and its output a name with '<'."""
    model = transpose_pair_model()
    nodes = model.graph.node
    nodes[1].name = HOSTILE
    nodes[1].output[0] = "t<1>"
    nodes[2].input[0] = "t<1>"
    return model


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # noqa: ANN001, ANN201
    """One optimize run with --html (real ONNX Runtime: the A/B and the check are the run's own)."""
    folder = tmp_path_factory.mktemp("html")
    src, out, page = folder / "in.onnx", folder / "out.onnx", folder / "run.html"
    onnx.save(_hostile_model(), src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--cost", "analytic", "--html", str(page)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return folder, page, page.read_text(encoding="utf-8")


def _chromium() -> str | None:
    return next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)


def _browser(binary: str, profile: str, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_page_renders_in_a_headless_browser(run, tmp_path):
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    _, page, _ = run
    url = page.as_uri()
    shot = tmp_path / "page.png"
    taken = _browser(binary, str(tmp_path / "profile"), f"--screenshot={shot}", "--window-size=1200,2000", url)
    assert shot.exists() and shot.stat().st_size > 20_000, taken.stderr[-2000:]
    print(f"\nscreenshot of the --html page: {shot}")
    dom = _browser(binary, str(tmp_path / "profile"), "--dump-dom", url).stdout
    assert "Wrote " in dom and "the optimized model" in _section(dom, "verdict")
    rewrites = _section(dom, "rewrites")
    assert rewrites.count('<svg class="graph"') == 4  # two steps, each before and after
    assert rewrites.count(">Transpose</text>") == 2 and ">Concat</text>" in rewrites
    assert 'id="latency-chart"' in dom and dom.count("<circle") >= 8  # a dot per session pair
    assert "xflow.certificate/1" in _section(dom, "certificate")
    assert "<img" not in dom  # the node name's markup stayed text


def _section(dom: str, name: str) -> str:
    found = re.search(rf'<section id="{name}"[^>]*>(.*?)</section>', dom, re.S)
    assert found is not None, f"no section {name}"
    return found.group(1)


def test_the_page_fetches_nothing_and_escapes_what_the_model_names(run):
    _, _, html = run
    assert not re.search(r"<(script|link|img|iframe|object)\b", html)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}  # the SVG namespace
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;" in html and "t&lt;1&gt;" in html


def test_a_bad_html_path_is_one_line_exit_2_and_nothing_written(tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(transpose_pair_model(), src)
    before = src.read_bytes()
    for page, says in ((tmp_path / "missing" / "p.html", "cannot write here"), (tmp_path, "is a directory"),
                       (src, "named as both")):
        result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--cost", "analytic", "--html", str(page)])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("xflow: error: ") and says in lines[0], lines
        assert not out.exists() and src.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]


def test_a_page_that_cannot_be_made_takes_the_model_back_out(tmp_path):
    """The page is one of the run's outputs: every output or none."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(transpose_pair_model(), src)

    def broken(report, certificate):  # noqa: ANN001, ANN202
        raise XflowError(str(tmp_path / "p.html"), "cannot write: No space left on device")

    with pytest.raises(XflowError, match="No space left"):
        optimize_file(str(src), str(out), OptimizeOptions.of(cost="analytic", measure=False),
                      say=lambda _m: None, page=PageRequest(str(tmp_path / "p.html"), broken))
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]


def test_the_layout_stacks_layers_downward_without_overlaps():
    boxes = [Box(v, 60.0 + 10 * k, 30.0) for k, v in enumerate("abcde")]
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("a", "d"), ("d", "e")]
    placed = layout(boxes, edges)
    y = {v: placed.centres[v][1] for v in "abcde"}
    assert y["a"] < y["b"] == y["c"] < y["d"] < y["e"]
    same_row = [(b1, b2) for b1 in boxes for b2 in boxes if b1.id < b2.id and y[b1.id] == y[b2.id]]
    for b1, b2 in same_row:
        assert abs(placed.centres[b1.id][0] - placed.centres[b2.id][0]) >= (b1.width + b2.width) / 2
    assert all(path[0][1] < path[-1][1] for _, _, path in placed.edges)
    assert len(next(p for a, b, p in placed.edges if (a, b) == ("a", "d"))) == 3  # routed by a waypoint
