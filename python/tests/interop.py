"""What tests/interop/write_checkpoint.cpp saves, recomputed here: the values of every
checkpoint the C++ writer makes, for tests to compare loads against."""

import math

import torch

# The dtypes of the format by LibTorch name, as the writer keys its "tensors.dtypes".
DTYPES = {
    "Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "Int": torch.int32, "Long": torch.int64,
    "Half": torch.float16, "BFloat16": torch.bfloat16, "Float": torch.float32, "Double": torch.float64,
    "Bool": torch.bool, "ComplexHalf": torch.complex32, "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128,
}


def deterministic_tensor(shape, dtype: torch.dtype) -> torch.Tensor:
    """arange(numel) * 0.37 - 5 in float64, reshaped and cast to `dtype` (+5 first for
    uint8; complex: the imaginary part is the negated real part), as the writer makes it."""
    numel = math.prod(shape)
    base = (torch.arange(numel, dtype=torch.float64) * 0.37 - 5).reshape(shape)
    if dtype == torch.uint8:
        return (base + 5).to(dtype)
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    return base.to(dtype)


def expected_values() -> dict:
    return {
        "none": None, "true": True, "false": False, "int_min": -2 ** 63, "int_max": 2 ** 63 - 1,
        "double": 0.1, "negative_zero": -0.0, "tiny": 5e-324, "huge": 1.7976931348623157e308, "third": 1.0 / 3.0,
        "exponent": 1e21, "nan": math.nan, "inf": math.inf, "minus_inf": -math.inf,
        "str": "h\u00e9llo \"quoted\" \\ /\n\t\x01\x7f \u2603 \U0001F40D", "empty_str": "", "empty_dict": {},
        "ints": [1, -2, 3], "doubles": [0.9, 0.999, -1e-7], "bools": [True, False], "strs": ["a", "b.c"],
        "empty_ints": [], "any": [1, "two", None, 2.5, False],
    }


def expected_single_state() -> dict:
    """The state dict `interop_write_checkpoint single DIR` saves."""
    layer = {"w": deterministic_tensor((2, 2), torch.float32)}
    return {
        "tensors": {
            "dtypes": {name: deterministic_tensor((3, 4, 5), dtype) for name, dtype in DTYPES.items()},
            "zero_dim": deterministic_tensor((), torch.float32),
            "empty": deterministic_tensor((0, 3), torch.float32),
            "transposed": deterministic_tensor((4, 6), torch.float64).t(),
            "big": deterministic_tensor((300, 1000), torch.float32),
        },
        "nested": {
            "inner": {"weight": deterministic_tensor((2, 3), torch.float32)},
            "dotted.key": deterministic_tensor((2,), torch.int64),
            "k\u00e9y \u2603": 7,
        },
        "layers": [dict(layer, index=0), dict(layer, index=1)],
        "mixed": [deterministic_tensor((3,), torch.float16), 3, "x"],
        "values": expected_values(),
    }


def expected_sharded_state() -> dict:
    """The global state dict the ranks of `interop_write_checkpoint sharded DIR` save."""
    return {
        "model": {
            "layer": {"weight": deterministic_tensor((11, 6), torch.float32),
                      "bias": deterministic_tensor((6,), torch.float32)},
            "cols": deterministic_tensor((7, 9), torch.float64),
            "big": deterministic_tensor((600, 512), torch.float32),
            "bf16": deterministic_tensor((5, 4), torch.bfloat16),
        },
        "step": 42,
    }


def assert_same(actual, expected, where="state") -> None:
    """Equal structure, types and values: tensors of the same dtype and shape with equal
    bits (NaN equal to NaN), floats equal as bits too (-0.0 is not 0.0)."""
    assert type(actual) is type(expected), f"{where}: {type(actual).__name__}, expected {type(expected).__name__}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}, expected {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{where}: {len(actual)} elements, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), \
            f"{where}: {actual.dtype} {list(actual.shape)}, expected {expected.dtype} {list(expected.shape)}"
        assert torch.equal(actual.view(-1).view(torch.uint8) if actual.numel() else actual,
                           expected.contiguous().view(-1).view(torch.uint8) if expected.numel() else expected), \
            f"{where}: values differ"
    elif isinstance(expected, float):
        same = actual == expected or (math.isnan(actual) and math.isnan(expected))
        assert same and math.copysign(1, actual) == math.copysign(1, expected), f"{where}: {actual!r}, not {expected!r}"
    else:
        assert actual == expected, f"{where}: {actual!r}, expected {expected!r}"
