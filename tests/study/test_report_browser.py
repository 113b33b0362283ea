"""The report's index.html opened in a real headless browser (Debian's Chromium, `make chromium`):
every image loads, and the page as drawn is not blank."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest

from study.reports.report import PLOTS, write_report

_BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_PROBE = """<script>
window.addEventListener("load", () => {
  const table = document.querySelector("#top table");
  const widths = document.createElement("pre");
  widths.id = "widths";
  widths.textContent = JSON.stringify({
    window: document.documentElement.clientWidth,
    page: document.documentElement.scrollWidth,
    table: table.getBoundingClientRect().right,
    box: [table.parentElement.scrollWidth, table.parentElement.clientWidth],
  });
  document.body.appendChild(widths);
  const sizes = document.createElement("pre");
  sizes.id = "image-sizes";
  sizes.textContent = JSON.stringify(
    Array.from(document.images, (i) => [i.getAttribute("src"), i.complete, i.naturalWidth, i.naturalHeight]));
  document.body.appendChild(sizes);
});
</script>"""
"""Added to a copy of the page: on load, every image's natural size and the widths of the page
and its top-trials table are written into the DOM, which ``--dump-dom`` prints."""


def _browser() -> str:
    found = next((path for name in _BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        pytest.skip("no Chromium here: `make chromium` installs Debian's (needs root and apt-get)")
    return found


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        browser,
        "--headless",
        "--no-sandbox",  # as root, in a container
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_every_image_of_the_report_loads_and_the_page_is_not_blank(
    smoke: tuple[Path, Any], tmp_path: Path
) -> None:
    browser = _browser()
    storage, _ = smoke
    report = write_report("parity-smoke", str(storage), out=str(tmp_path / "report"))
    index = Path(report.index)

    # a copy of the page with the probe and one image that does not exist, which must read 0 wide
    probe = index.with_name("probe.html")
    text = index.read_text(encoding="utf-8")
    probe.write_text(text.replace("</body>", f'<img src="no-such.png" alt="x">{_PROBE}</body>'))
    dom = _chromium(
        browser,
        tmp_path / "profile",
        "--virtual-time-budget=10000",
        "--window-size=1200,2000",
        "--dump-dom",
        probe.as_uri(),
    )
    found = re.search(r'<pre id="image-sizes">(.*?)</pre>', dom.stdout, flags=re.S)
    assert found, dom.stdout[-2000:]
    sizes = {
        src: (complete, width, height) for src, complete, width, height in json.loads(html.unescape(found[1]))
    }
    assert set(sizes) == {f"{key}.png" for key in PLOTS} | {"no-such.png"}
    assert sizes.pop("no-such.png")[1] == 0  # the probe tells a broken image
    for src, (complete, width, height) in sizes.items():
        assert complete and width > 0 and height > 0, (src, sizes[src])
    # the top-trials table fits a 1,200 px window: no column cut off, no scrolling needed
    found = re.search(r'<pre id="widths">(.*?)</pre>', dom.stdout, flags=re.S)
    assert found, dom.stdout[-2000:]
    widths = json.loads(html.unescape(found[1]))
    assert widths["window"] == 1200 and widths["page"] <= 1200, widths
    assert widths["table"] <= 1200 and widths["box"][0] <= widths["box"][1], widths

    shot = tmp_path / "page.png"
    _chromium(
        browser, tmp_path / "profile", "--window-size=1280,3000", f"--screenshot={shot}", index.as_uri()
    )
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (3000, 1280)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50, f"{len(colours)} colours: the page drew nearly nothing"
    # the plots' ink, not only the page's text: more than 2 % of the pixels are not white
    assert (pixels.min(axis=2) < 0.9).mean() > 0.02
