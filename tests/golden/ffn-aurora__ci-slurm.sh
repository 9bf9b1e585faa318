REFUSED: jobs/ffn-aurora.yaml:19: resources.nodes: 2 nodes requested but queue 'debug' of site 'ci-slurm' allows at most 1; lower --nodes or pick a larger queue
