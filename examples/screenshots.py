"""Render the executed notebooks' views to PNG screenshots, as a browser shows them.

Each notebook in ``examples/`` (as saved, outputs included: rebuild them first
with ``python examples/build_notebooks.py``) is converted to HTML by nbconvert
and drawn by headless Chromium (Debian's ``chromium`` package), then cut to
the page's content and saved as ``examples/screenshots/<name>.png``.

    python examples/screenshots.py            # every notebook
    python examples/screenshots.py quickstart  # one

Needs ``nbconvert`` and Pillow (``pip install nbconvert pillow``) and a
``chromium`` (or ``chromium-browser``, ``google-chrome``) on the PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "screenshots"
NOTEBOOKS = ("quickstart", "labelled")
WIDTH = 1100
# Taller than any of the notebooks; the screenshot is cut to the content afterwards.
HEIGHT = 9000


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("screenshots.py: no chromium on the PATH (Debian: apt-get install chromium)")


def render(name: str, chromium: str, work: Path) -> Path:
    """``examples/<name>.ipynb`` drawn as the browser draws it, cut to its content."""
    from PIL import Image, ImageChops

    html = work / f"{name}.html"
    subprocess.run(
        ["jupyter", "nbconvert", "--to", "html", str(HERE / f"{name}.ipynb"), "--output", str(html)],
        check=True,
        capture_output=True,
    )
    raw = work / f"{name}.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={raw}", html.as_uri()],
        check=True,
        capture_output=True,
    )  # fmt: skip
    image = Image.open(raw).convert("RGB")
    # Cut the white below (and beside) the last output: the bounding box of what is not background.
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box is not None:
        image = image.crop((0, 0, image.width, min(image.height, box[3] + 24)))
    OUT.mkdir(exist_ok=True)
    target = OUT / f"{name}.png"
    image.save(target, optimize=True)
    return target


def main(names: list[str]) -> None:
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        sys.exit(f"screenshots.py: unknown notebook(s) {unknown}; choose from {', '.join(NOTEBOOKS)}")
    chromium = browser()
    with tempfile.TemporaryDirectory() as folder:
        for name in names or NOTEBOOKS:
            print(f"wrote {render(name, chromium, Path(folder))}")


if __name__ == "__main__":
    main(sys.argv[1:])
