"""How good a segmentation is against ground truth (``evaluate``: VOI, adapted Rand) and the baselines a trained
FFN must beat (``baseline``: thresholded connected components; ``watershed``: seeded watershed, tuned)."""
