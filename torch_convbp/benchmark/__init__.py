"""torch_convbp's benchmarks, inside the package so that any install can run them:

    python -m torch_convbp bench [options]     # the layer benchmark (suite.py)
    python -m torch_convbp models [options]    # whole torchvision models (models.py; needs torchvision)

benchmarks/bench_conv.py and bench_models.py are the same commands for a checkout. The layers are
package data (shapes.json); results/ and NOTES.md stay in the repository's benchmarks/.
"""
