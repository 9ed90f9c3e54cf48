#!/usr/bin/env python3
"""Dev-only: regenerates the small PNG textures in scenes/textures/.

Uses only the standard library (zlib, struct), and is deterministic, so the
committed PNGs can be rebuilt byte for byte: `python3 scenes/make_textures.py`.
"""

import math
import os
import struct
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "textures")


def write_png(path, width, height, pixel):
    """Writes an RGB8 PNG; `pixel(x, y)` returns an (r, g, b) tuple of floats in 0..1."""
    rows = b""
    for y in range(height):
        row = bytearray([0])  # filter type: none
        for x in range(width):
            row.extend(max(0, min(255, round(c * 255))) for c in pixel(x, y))
        rows += bytes(row)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
    png += chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def hash01(x, y, seed):
    """A deterministic pseudo-random value in [0, 1) for integer lattice point (x, y)."""
    h = (x * 374761393 + y * 668265263 + seed * 2147483647) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 1274126177) & 0xFFFFFFFF
    return (h ^ (h >> 16)) / 2**32


def noise(x, y, period, seed):
    """Smooth value noise that tiles every `period` lattice cells."""
    x0, y0 = math.floor(x), math.floor(y)
    fx, fy = x - x0, y - y0
    sx, sy = fx * fx * (3 - 2 * fx), fy * fy * (3 - 2 * fy)
    corner = lambda i, j: hash01((x0 + i) % period, (y0 + j) % period, seed)
    top = corner(0, 0) + (corner(1, 0) - corner(0, 0)) * sx
    bottom = corner(0, 1) + (corner(1, 1) - corner(0, 1)) * sx
    return top + (bottom - top) * sy


def mix(a, b, t):
    return tuple(p + (q - p) * t for p, q in zip(a, b))


def checker(x, y):
    light, dark = (0.93, 0.89, 0.80), (0.72, 0.27, 0.18)
    return light if (x // 8 + y // 8) % 2 == 0 else dark


def wood(x, y):
    # Eight growth rings across the tile, wobbled by tileable noise.
    n = noise(x / 32, y / 16, 4, 1) * 0.7 + noise(x / 8, y / 8, 16, 2) * 0.3
    ring = (y * 8 / 128 + 1.6 * n) % 1.0
    grain = 0.08 * noise(x / 2, y / 32, 64, 3)
    return mix((0.80, 0.58, 0.36), (0.50, 0.30, 0.16), ring**3 + grain)


def bricks(x, y):
    row = y // 16
    bx = (x + (8 if row % 2 else 0)) % 32
    mortar = bx < 2 or y % 16 < 2
    if mortar:
        return (0.78, 0.76, 0.72)
    shade = 0.8 + 0.35 * hash01((x + (8 if row % 2 else 0)) // 32, row, 4)
    speckle = 0.1 * noise(x / 3, y / 3, 42, 5)
    return tuple(c * (shade - speckle) for c in (0.66, 0.30, 0.22))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    write_png(os.path.join(OUT, "checker.png"), 64, 64, checker)
    write_png(os.path.join(OUT, "wood.png"), 128, 128, wood)
    write_png(os.path.join(OUT, "bricks.png"), 128, 128, bricks)
