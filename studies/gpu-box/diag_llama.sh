#!/usr/bin/env bash
# Which process state makes llama.cpp's CUDA build segfault in model load? On the box,
# through run.sh (PYTHONPATH, TANDEM_MODEL set):
#   bash deploy/gpu-box/run.sh bash studies/gpu-box/diag_llama.sh
# Prints one line per variant: rc 0 loaded, 139 segfault, 124 (the worker variants)
# still running after 20 s, i.e. loaded and registering. See README.md, "What the box
# said on 2026-12-03".
m=${DIAG_MODEL:-$TANDEM_MODEL}
load='import llama_cpp as L; L.llama_backend_init(); p=L.llama_model_default_params(); p.n_gpu_layers=-1; assert L.llama_model_load_from_file(b"'$m'", p)'
backend='from tandem.workers.backends import llama as B; B.LlamaBackend("'$m'", device="gpu", n_ctx=512)'
try() { local name=$1; shift; timeout 60 "$@" > /tmp/diag.out 2>&1; echo "VARIANT $name rc $?"; }
try plain python3 -c "$load"
try logset python3 -c "import ctypes, llama_cpp as L; cb=L.llama_log_callback(lambda l,t,u: None); L.llama_log_set(cb, ctypes.c_void_p()); $load"
try zmq_first python3 -c "import zmq; $load"
try linalg_first python3 -c "import numpy.linalg; $load"
try exts_first python3 -c "import msgspec, psutil, markupsafe, tokenizers, jinja2; $load"
try backend python3 -c "$backend"
try logging_backend python3 -c "import logging; logging.basicConfig(level=logging.INFO); $backend"
try cli_imports python3 -c "import tandem.cli.main, tandem.workers.main; $backend"
try cli_worker timeout 20 python3 -m tandem worker --backend llama.cpp --device gpu --model "$m" --threads 1 --router tcp://127.0.0.1:5999 --warmup off --worker-id d
tail -5 /tmp/diag.out
try cli_worker_preload timeout 20 python3 -c "import llama_cpp, sys; from tandem.cli.main import main; sys.argv=['tandem','worker','--backend','llama.cpp','--device','gpu','--model','$m','--threads','1','--router','tcp://127.0.0.1:5999','--warmup','off','--worker-id','d']; main()"
tail -3 /tmp/diag.out
