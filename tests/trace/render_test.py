#!/usr/bin/env python3
"""`troupe trace --svg` and `--html` opened in headless Chromium (Debian's
chromium, which scripts/setup installs): each screenshot must not be blank
(enough non-white pixels, and the forward and backward colors present),
the page must log no console errors, and its inline script must have run
(it marks <body data-report="ready">, read back with --dump-dom).

    render_test.py TROUPE WORKDIR

Exits 77 (ctest's SKIP_RETURN_CODE) when there is no chromium. PNGs are
decoded here with zlib (Debian's python3-pil is not a dependency).
"""
import os
import shutil
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
TROUPE, WORK = sys.argv[1], sys.argv[2]
FORWARD, BACKWARD = (47, 98, 178), (84, 160, 72)  # launcher/trace/svg.cc


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def png_pixels(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB/RGBA PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path + ": not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                fail("%s: PNG depth %d color %d interlace %d: not decoded here" %
                     (path, depth, color, interlace))
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # the PNG filters: none, sub, up, average, Paeth
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def check_picture(path, what):
    """An error text, or "" when the screenshot shows a schedule."""
    w, h, rows = png_pixels(path)
    colors, ink = {}, 0
    for row in rows:
        for px in row:
            colors[px] = colors.get(px, 0) + 1
            ink += px != (255, 255, 255)
    near = lambda want: sum(n for c, n in colors.items() if max(abs(c[i] - want[i]) for i in range(3)) <= 6)
    if ink < 0.03 * w * h:
        return "%s: %d of %d pixels not white: blank" % (what, ink, w * h)
    if near(FORWARD) < 500 or near(BACKWARD) < 500:
        return "%s: forward %d px, backward %d px: no schedule blocks" % (what, near(FORWARD), near(BACKWARD))
    return ""


def chromium(*args):
    p = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                        "--enable-logging=stderr", "--v=0", *args],
                       capture_output=True, text=True, timeout=120)
    return p


def console_errors(stderr):
    return [l for l in stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]


if shutil.which("chromium") is None:
    print("SKIP: no chromium (scripts/setup installs Debian's)")
    sys.exit(77)
os.makedirs(WORK, exist_ok=True)
d = os.path.join(WORK, "render")
shutil.rmtree(d, ignore_errors=True)
subprocess.run([sys.executable, os.path.join(HERE, "make_trace.py"), d, "--pp", "4", "--m", "8",
                "--steps", "3"], check=True)
svg, html = os.path.join(WORK, "render.svg"), os.path.join(WORK, "render.html")
subprocess.run([TROUPE, "trace", d, "--svg", svg, "--arrows", "--html", html], check=True,
               capture_output=True)

# The checker itself must see a blank page as blank.
blank = os.path.join(WORK, "blank.svg")
open(blank, "w").write('<svg xmlns="http://www.w3.org/2000/svg" width="800" height="300"></svg>\n')
for name, src, size in (("blank", blank, "800,300"), ("svg", svg, "1400,260"),
                        ("html", html, "1500,1800")):
    png = os.path.join(WORK, "render_%s.png" % name)
    if os.path.exists(png):
        os.remove(png)
    p = chromium("--screenshot=" + png, "--window-size=" + size, "file://" + src)
    if not os.path.exists(png):
        fail("%s: chromium wrote no screenshot (exit %d)\n%s" % (name, p.returncode, p.stderr[-2000:]))
    err = check_picture(png, name)
    if name == "blank":
        if not err:
            fail("the checker did not see the blank page as blank")
        continue
    if err:
        fail(err)
    if console_errors(p.stderr):
        fail("%s: console messages:\n%s" % (name, "\n".join(console_errors(p.stderr))))

p = chromium("--dump-dom", "file://" + html)
if 'data-report="ready"' not in p.stdout:
    fail("the page's script did not run (no data-report=\"ready\" in the DOM)\n" + p.stderr[-2000:])
if console_errors(p.stderr):
    fail("html: console messages:\n" + "\n".join(console_errors(p.stderr)))
for needle in ("<svg", "loss", "learning rate", "tokens/s", "grad norm", "mean bubble"):
    if needle not in p.stdout:
        fail("the page has no '%s'" % needle)
if "http://" in open(html).read().replace('xmlns="http://www.w3.org/2000/svg"', ""):
    fail("the page refers to something on the network")
print("OK: svg and html render (not blank, both colors), no console errors, script ran")
