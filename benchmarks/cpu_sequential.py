"""Sequential (CPU backend) reference of the GPU benchmark task: 3 epochs of
mini-batch Adagrad on the 4M-row Criteo-like data, test AUC per epoch.

    PYTHONPATH=. python benchmarks/cpu_sequential.py ROWS N_FACTORS LR BATCH
"""
import sys, time, numpy as np
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sklearn.metrics import roc_auc_score
from sklearn_cuwide._backends import _cpu as be
from sklearn_cuwide._solvers import batch_weights
from sklearn_cuwide._state import ModelState, StepParams
from sklearn_cuwide.datasets import make_ctr_classification
rows=int(sys.argv[1]); k=int(sys.argv[2]); lr=float(sys.argv[3]); batch=int(sys.argv[4])
X,y=make_ctr_classification(n_samples=4_400_000,n_features=2**22,model="fm",random_state=0)
Xtr,ytr,Xte,yte=X[:rows],y[:rows],X[4_000_000:],y[4_000_000:]
params=StepParams(model="fm" if k else "linear",loss="logistic",solver="adagrad",learning_rate=lr,l2_w=1e-7,l2_v=1e-6 if k else 0.0)
sb,nh=be.tile_shape(params,1,k,batch)
L=be.build_layout(Xtr,batch_size=batch,sample_block=sb,n_hot_max=nh,shuffle=True,random_state=0)
ro=L.row_order; yl=ytr[ro].astype(np.float32); sw=np.ones(L.n_rows,np.float32); bw=batch_weights(L,np.ones(L.n_rows))
st=ModelState.zeros(X.shape[1],1,k,adagrad=True,init_scale=0.01,random_state=0).permute_features(L.feature_order)
rng=np.random.default_rng(0)
for ep in range(3):
    t=time.time(); l=be.run_epoch(L,yl,sw,bw,st,params,rng.permutation(L.n_batches))/L.n_rows
    h=st.permute_features(L.feature_rank)
    d=be.decision_function(Xte,h.w,h.b,h.V)[:,0]
    print(f"rows {rows} k {k} lr {lr} B {batch} epoch {ep+1} loss {l:.4f} auc {roc_auc_score(yte,d):.4f} {time.time()-t:.1f}s", flush=True)
