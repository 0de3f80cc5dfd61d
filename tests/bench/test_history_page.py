"""The history page (``attnbench history report``) rendered by a real browser: headless
Chromium loads the file as a user opens it (file://, no server, no network), and the DOM it
laid out and a screenshot are checked: it renders, every plot has its points, the step is
marked. Skipped, saying so, where no Chromium is installed (.ci/run installs Debian's)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from attnbench.bench.history.report import write_report
from attnbench.bench.history.store import History
from attnbench.bench.history.svg import STEP_COLOUR
from tests.helpers.history import commit_line, sha

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        pytest.skip(
            "no headless Chromium on this machine (apt-get install chromium; .ci/run installs "
            "it): the history page is not rendered"
        )
    return found


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """30 commits; gau 1.3x slower from commit 15 on, local flat."""
    tmp = tmp_path_factory.mktemp("page")
    levels = [{"local": 0.5, "gau": 1.2 * (1.3 if i >= 15 else 1.0)} for i in range(30)]
    with History(tmp / "history", create=True) as history:
        for run in commit_line(tmp / "runs", levels):
            history.add(run)
    return write_report(tmp / "history", tmp / "page").path


def chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={profile}"]  # fmt: skip
    done = subprocess.run(
        [browser, *flags, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_the_page_is_one_file_that_needs_no_network(page):
    html = page.read_text()
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", html)
    assert html.count('<svg class="plot"') == 2  # the reference's family, and the sparse one


def test_the_browser_draws_the_points_and_marks_the_step(browser, page, tmp_path):
    dom = chromium(browser, tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    assert re.search(r'<body[^>]*data-drawn="yes"', dom), dom[:2000]
    plots = re.findall(r'<svg class="plot"[^>]*>', dom)
    drawn = [
        (int(re.search(r'data-drawn-points="(\d+)"', p)[1]),
         int(re.search(r'data-drawn-steps="(\d+)"', p)[1]))
        for p in plots
    ]  # fmt: skip
    assert drawn == [(30, 0), (120, 2)]  # softmax: 1 case; sparse: 4 cases, gau's 2 steps
    step_titles = re.findall(r'<g class="step">.*?<title>(.*?)</title>', dom, re.S)
    assert len(step_titles) == 2
    assert all(f"between commit {sha(14)[:10]} and {sha(15)[:10]}" in t for t in step_titles)
    assert all(t.startswith("step x1.") and "gau:efficient" in t for t in step_titles)
    assert f"commit {sha(15)}" in dom  # a point's hover text names its commit


def test_the_screenshot_shows_the_step_in_red(browser, page, tmp_path):
    shot = tmp_path / "page.png"
    chromium(browser, tmp_path / "profile", "--window-size=1100,1500", "--hide-scrollbars",
             f"--screenshot={shot}", page.as_uri())  # fmt: skip
    pixels = imread(shot)[..., :3]
    red = np.array([int(STEP_COLOUR[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    near = np.abs(pixels - red).max(axis=-1) < 0.08
    # the step's dashed line: one column red over most of a plot's height (text is not)
    assert near.sum(axis=0).max() > 100, near.sum(axis=0).max()
    drawn = (pixels < 0.9).any(axis=-1).mean()
    assert 0.02 < drawn < 0.6, drawn  # something drawn, not a blank or black page
