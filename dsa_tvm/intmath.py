"""Integer arithmetic every layer needs, defined once: ceiling division and the output
size of a sliding window (conv, pool). Imports nothing, so any layer may use it."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in exact integer arithmetic (``b > 0``)."""
    return -(-a // b)


def window_out(size: int, kernel: int, stride: int, pad_before: int, pad_after: int,
               dilation: int = 1) -> int:
    """Output positions of a window of ``kernel`` taps ``dilation`` apart, moved by
    ``stride`` over ``size`` positions padded by ``pad_before`` / ``pad_after``
    (ONNX/PyTorch semantics, floor mode)."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def window_out_hw(h: int, w: int, kernel: tuple[int, int], strides: tuple[int, int],
                  padding: tuple[int, int, int, int],
                  dilation: tuple[int, int] = (1, 1)) -> tuple[int, int]:
    """(OH, OW) of a 2-D window; ``padding`` is (top, left, bottom, right)."""
    pt, pl, pb, pr = padding
    return (window_out(h, kernel[0], strides[0], pt, pb, dilation[0]),
            window_out(w, kernel[1], strides[1], pl, pr, dilation[1]))
