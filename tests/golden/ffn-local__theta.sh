REFUSED: jobs/ffn-local.yaml:47: resources.nodes: 1 nodes requested but queue 'default' of site 'theta' needs at least 128
