REFUSED: jobs/resnet-local.yaml:19: resources.nodes: 1 nodes requested but queue 'default' of site 'theta' needs at least 128
