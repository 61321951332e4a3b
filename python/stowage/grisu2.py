"""The decimal digits nlohmann::json writes for a double: a port of its Grisu2
(nlohmann/detail/conversions/to_chars.hpp, after Loitsch's reference implementation).

Grisu2's digits read back as the double but are not always the shortest or the closest
such digits (about 0.3% of random doubles differ from Python's repr()), and
metadata_xxh3 hashes nlohmann's exact text: hence this port, integer for integer, with
64-bit wrap-around where the C++ has it.
"""

from fractions import Fraction
import math
import struct

_U64 = (1 << 64) - 1
_ALPHA = -60
_CACHED_POWERS_MIN_DECIMAL_EXPONENT = -300
_CACHED_POWERS_DECIMAL_STEP = 8


def _cached_power(k: int):
    """10**k as (f, e) with f * 2**e ~= 10**k, 2**63 <= f < 2**64, f rounded to nearest:
    the entries of nlohmann's kCachedPowers table, computed instead of copied."""
    value = Fraction(10) ** k
    e = math.floor(k * math.log2(10)) - 63
    f = round(value / Fraction(2) ** e)
    while f >= 1 << 64:  # log2's float may be one off: settle it exactly
        e += 1
        f = round(value / Fraction(2) ** e)
    while f < 1 << 63:
        e -= 1
        f = round(value / Fraction(2) ** e)
    return f, e


_CACHED_POWERS = [(*_cached_power(k), k) for k in range(-300, 325, 8)]


def _mul(x, y):
    """The upper 64 bits of the 128-bit product, rounded (ties up): diyfp::mul."""
    (xf, xe), (yf, ye) = x, y
    return (xf * yf + (1 << 63)) >> 64, xe + ye + 64


def _normalize(f: int, e: int):
    shift = 64 - f.bit_length()
    return f << shift, e - shift


def _boundaries(value: float):
    """v, m-, m+ of compute_boundaries: the double and the midpoints to its neighbours."""
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    biased_exponent = bits >> 52
    fraction = bits & ((1 << 52) - 1)
    if biased_exponent == 0:
        v = (fraction, 1 - 1075)
    else:
        v = (fraction + (1 << 52), biased_exponent - 1075)
    lower_boundary_is_closer = fraction == 0 and biased_exponent > 1
    m_plus = (2 * v[0] + 1, v[1] - 1)
    m_minus = (4 * v[0] - 1, v[1] - 2) if lower_boundary_is_closer else (2 * v[0] - 1, v[1] - 1)
    w_plus = _normalize(*m_plus)
    w_minus = (m_minus[0] << (m_minus[1] - w_plus[1]), w_plus[1])
    return _normalize(*v), w_minus, w_plus


def _cached_power_for_binary_exponent(e: int):
    f = _ALPHA - e - 1
    k = (f * 78913) // (1 << 18) + (1 if f > 0 else 0)
    # C++ integer division truncates toward zero: correct the floor for negative f.
    if f * 78913 < 0 and (f * 78913) % (1 << 18):
        k += 1
    step = _CACHED_POWERS_DECIMAL_STEP
    index = (-_CACHED_POWERS_MIN_DECIMAL_EXPONENT + k + (step - 1)) // step
    return _CACHED_POWERS[index]


def _round(digits: list, dist: int, delta: int, rest: int, ten_k: int) -> None:
    while (rest < dist and (delta - rest) & _U64 >= ten_k
           and (((rest + ten_k) & _U64) < dist or ((dist - rest) & _U64) > ((rest + ten_k - dist) & _U64))):
        digits[-1] -= 1
        rest = (rest + ten_k) & _U64


def _digit_gen(m_minus, w, m_plus):
    delta = (m_plus[0] - m_minus[0]) & _U64
    dist = (m_plus[0] - w[0]) & _U64
    shift = -m_plus[1]
    one = 1 << shift
    p1 = m_plus[0] >> shift
    p2 = m_plus[0] & (one - 1)
    digits: list = []
    decimal_exponent = 0
    n = len(str(p1)) if p1 else 1
    pow10 = 10 ** (n - 1)
    while n > 0:
        digits.append(p1 // pow10)
        p1 %= pow10
        n -= 1
        rest = ((p1 << shift) + p2) & _U64
        if rest <= delta:
            _round(digits, dist, delta, rest, (pow10 << shift) & _U64)
            return digits, decimal_exponent + n
        pow10 //= 10
    m = 0
    while True:
        p2 = (p2 * 10) & _U64
        digits.append(p2 >> shift)
        p2 &= one - 1
        m += 1
        delta = (delta * 10) & _U64
        dist = (dist * 10) & _U64
        if p2 <= delta:
            break
    _round(digits, dist, delta, p2, one)
    return digits, decimal_exponent - m


def digits_and_exponent(value: float):
    """For a finite, positive double: (digits, exponent) with value ~= int(digits) * 10**exponent,
    the digits nlohmann writes."""
    v, m_minus, m_plus = _boundaries(value)
    cached_f, cached_e, cached_k = _cached_power_for_binary_exponent(m_plus[1])
    c = (cached_f, cached_e)
    w = _mul(v, c)
    w_minus = _mul(m_minus, c)
    w_plus = _mul(m_plus, c)
    digits, exponent = _digit_gen((w_minus[0] + 1, w_minus[1]), w, (w_plus[0] - 1, w_plus[1]))
    return "".join(map(str, digits)), exponent - cached_k
