"""How a pair runs fast on this machine: the runtime. plan.py decides everything once, at load time, and
records it in `pair.runtime`; the other modules are the pieces it picks from (products and kernels, attention,
compiled passes and CUDA graphs) and the measurements it decides by (costs.py, dtype_choice.py, theory.py)."""
