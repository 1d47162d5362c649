import torch, time, json, subprocess, threading
torch.backends.cuda.matmul.allow_tf32=False
n=8192
a=torch.randn(n,n,device='cuda',dtype=torch.bfloat16); b=torch.randn(n,n,device='cuda',dtype=torch.bfloat16)
c=torch.empty(n,n,device='cuda',dtype=torch.bfloat16)
samples=[]
stop=False
def smi():
    while not stop:
        out=subprocess.run(['nvidia-smi','--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active','--format=csv,noheader'],capture_output=True,text=True).stdout.strip()
        samples.append((round(time.time()-t0,1),out)); time.sleep(1)
t0=time.time()
th=threading.Thread(target=smi); th.start()
windows=[]
for w in range(20):
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(500): torch.matmul(a,b,out=c)
    e.record(); torch.cuda.synchronize()
    ms=s.elapsed_time(e)/500
    windows.append(round(2*n**3/ms/1e9,1))
stop=True; th.join()
print(json.dumps({"gemm_8192_tflops_per_window_of_500":windows,"smi":samples}))
