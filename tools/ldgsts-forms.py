#!/usr/bin/env python3
"""Counts the cp.async (LDGSTS) instruction forms in sm_90 cubins, without cuobjdump.

The L2-hinted cp.async of the decode GEMV trapped with "illegal instruction" on the H200 where
ptxas emitted the uniform-register form LDGSTS [R+UR+imm] (bench/RESULTS.md 2026-12-02); the
plain form LDGSTS [R+imm] runs. This machine has ptxas but no disassembler, so this script reads
the cubin's .text sections directly: 16-byte instructions whose low 12 bits are 0xfae (plain) or
0xdae (uniform-register address), and the low byte of the second word (the memory descriptor's
register field). The encodings were read off `cuobjdump -sass` of the same cubins on the device.

    nvcc -O3 --generate-code=arch=compute_90a,code=sm_90a -std=c++20 --expt-relaxed-constexpr \\
      -DSERVAL_HAVE_CUDA=1 -Isrc -I. -cubin src/kernels/cuda/gemm/quant_gemv.cu -o /tmp/q.cubin
    tools/ldgsts-forms.py /tmp/q.cubin
"""
import collections
import struct
import sys

FORMS = {0xFAE: "plain [R+imm]", 0xDAE: "uniform [R+UR+imm]"}


def text_sections(path):
    """(name, bytes) of each .text.* section of an ELF64 little-endian file."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{path}: not an ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, strndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[strndx][4]
    for h in headers:
        name = data[names + h[0] : data.index(b"\0", names + h[0])].decode()
        if name.startswith(".text."):
            yield name, data[h[4] : h[4] + h[5]]


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for path in sys.argv[1:]:
        counts = collections.Counter()
        for _, code in text_sections(path):
            for i in range(0, len(code) - 15, 16):
                low, high = struct.unpack_from("<QQ", code, i)
                if low & 0xFFF in FORMS:
                    counts[(FORMS[low & 0xFFF], high & 0xFF)] += 1
        print(path)
        for (form, desc), n in sorted(counts.items()):
            print(f"  {n:5d} LDGSTS {form}, descriptor field {desc:#04x}")


if __name__ == "__main__":
    main()
