"""BLAKE3 (unkeyed, 32-byte output) in pure Python.

Only for what the client hashes itself: the coordinator's certificate, to
pin it by the client ticket's ``fp=``, and small downloaded frames, to check
them against their digest. Scene files are hashed and uploaded by the
``tessera`` binary, which is hundreds of times faster.
"""

_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
       0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERM = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_CHUNK_START, _CHUNK_END, _PARENT, _ROOT = 1, 2, 4, 8
_M = 0xFFFFFFFF


def _compress(cv, words, counter, block_len, flags):
    s = list(cv) + list(_IV[:4]) + [counter & _M, (counter >> 32) & _M, block_len, flags]
    m = list(words)

    def g(a, b, c, d, x, y):
        s[a] = (s[a] + s[b] + x) & _M
        v = s[d] ^ s[a]
        s[d] = ((v >> 16) | (v << 16)) & _M
        s[c] = (s[c] + s[d]) & _M
        v = s[b] ^ s[c]
        s[b] = ((v >> 12) | (v << 20)) & _M
        s[a] = (s[a] + s[b] + y) & _M
        v = s[d] ^ s[a]
        s[d] = ((v >> 8) | (v << 24)) & _M
        s[c] = (s[c] + s[d]) & _M
        v = s[b] ^ s[c]
        s[b] = ((v >> 7) | (v << 25)) & _M

    for r in range(7):
        g(0, 4, 8, 12, m[0], m[1])
        g(1, 5, 9, 13, m[2], m[3])
        g(2, 6, 10, 14, m[4], m[5])
        g(3, 7, 11, 15, m[6], m[7])
        g(0, 5, 10, 15, m[8], m[9])
        g(1, 6, 11, 12, m[10], m[11])
        g(2, 7, 8, 13, m[12], m[13])
        g(3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in _PERM]
    for i in range(8):
        s[i] ^= s[i + 8]
        s[i + 8] ^= cv[i]
    return s


def _words(block):
    block = block.ljust(64, b"\0")
    return [int.from_bytes(block[i:i + 4], "little") for i in range(0, 64, 4)]


def _chunk(chunk, index, root):
    """The chaining value of one chunk (its output bytes' words when root)."""
    cv = _IV
    blocks = [chunk[i:i + 64] for i in range(0, len(chunk), 64)] or [b""]
    for n, block in enumerate(blocks):
        flags = (_CHUNK_START if n == 0 else 0) | (_CHUNK_END if n == len(blocks) - 1 else 0)
        if root and n == len(blocks) - 1:
            flags |= _ROOT
        cv = _compress(cv, _words(block), index, len(block), flags)[:8]
    return cv


def _parent(left, right, root):
    return _compress(_IV, list(left) + list(right), 0, 64, _PARENT | (_ROOT if root else 0))[:8]


def blake3_hex(data):
    """The BLAKE3 hash of ``data`` as 64 lowercase hex digits."""
    data = bytes(data)
    chunks = [data[i:i + 1024] for i in range(0, len(data), 1024)] or [b""]
    if len(chunks) == 1:
        out = _chunk(chunks[0], 0, True)
    else:
        stack = []
        for index, chunk in enumerate(chunks[:-1]):
            cv = _chunk(chunk, index, False)
            total = index + 1
            while total & 1 == 0:
                cv = _parent(stack.pop(), cv, False)
                total >>= 1
            stack.append(cv)
        cv = _chunk(chunks[-1], len(chunks) - 1, False)
        while len(stack) > 1:
            cv = _parent(stack.pop(), cv, False)
        out = _parent(stack.pop(), cv, True)
    return b"".join(w.to_bytes(4, "little") for w in out).hex()
