# The seed document's first method ("1. 使用MPI与CuPy结合"), copied verbatim: benchmarks/gpu_machine_mpi_cuda.sh
# runs it unchanged against Debian's Open MPI and against the CUDA-aware build. Do not fix it here
# (examples/mpi_cupy.py is the corrected one).
from mpi4py import MPI
import cupy as cp

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

# 每个进程选择不同的GPU
cp.cuda.Device(rank).use()

# 示例：分布式数组计算
if rank == 0:
    data = cp.arange(10, dtype=cp.float32)
else:
    data = cp.empty(10, dtype=cp.float32)

# 广播数据
comm.Bcast(data, root=0)

# 每个节点处理部分数据
local_result = cp.square(data[rank::size])

# 收集结果
gathered_results = None
if rank == 0:
    gathered_results = cp.empty([size, len(local_result)], dtype=cp.float32)
    
comm.Gather(local_result, gathered_results, root=0)

if rank == 0:
    final_result = gathered_results.reshape(-1)
    print(final_result)
