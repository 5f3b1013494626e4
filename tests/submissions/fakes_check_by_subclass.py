"""Hostile: returns a torch.Tensor subclass whose __torch_function__ answers every operation with zeros
(so `out - ref` is zero and every comparison false), holding zeros itself."""
import torch


class Liar(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("__get__", "shape", "dtype", "device", "dim", "numel", "size", "element_size", "is_cuda",
                    "contiguous", "detach", "reshape", "view", "as_subclass", "copy_", "__len__"):
            return super().__torch_function__(func, types, args, kwargs or {})
        return torch.zeros(())


def custom_kernel(data):
    out = torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
    return out.as_subclass(Liar)
