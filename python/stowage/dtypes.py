"""The format's dtype names (LibTorch's) as torch dtypes."""

import torch

TORCH_DTYPES = {
    "Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "Int": torch.int32, "Long": torch.int64,
    "Half": torch.float16, "BFloat16": torch.bfloat16, "Float": torch.float32, "Double": torch.float64,
    "Bool": torch.bool, "ComplexHalf": torch.complex32, "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128,
}
