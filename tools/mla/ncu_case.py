"""Run custom_kernel on one benchmark-like shape a few times (for ncu / nsys): B KV [QLEN]."""
import sys
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
import reference as R  # noqa: E402
import submission as S  # noqa: E402

b, kv = int(sys.argv[1]), int(sys.argv[2])
qlen = int(sys.argv[3]) if len(sys.argv) > 3 else 1
data = R.generate_input(b, qlen, kv, 7)
for _ in range(3):
    S.custom_kernel(data)
torch.cuda.synchronize()
