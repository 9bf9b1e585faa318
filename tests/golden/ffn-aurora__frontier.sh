REFUSED: jobs/ffn-aurora.yaml:22: resources.gpus_per_rank: 12 ranks x 1 GPUs per node requested but a node of site 'frontier' has 8
