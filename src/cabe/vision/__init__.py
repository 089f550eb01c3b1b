"""Vision towers, one room per mechanism: the images a sequence carries (:mod:`.images`: sizes, resizing, the patch
grid, the checks), one tower block as a spec (:mod:`.block`), the tower in a training step (:mod:`.training`) and in
serving's prefill (:mod:`.serving`), and one room per tower kind — Qwen2.5-VL (:mod:`.qwen25`), Gemma 3's SigLIP
(:mod:`.siglip`), Qwen3-VL (:mod:`.qwen3`). Each names its transformers source and the tests that prove it."""
