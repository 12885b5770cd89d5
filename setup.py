from setuptools import find_packages, setup

setup(
    name="deepnet_fairseq",
    version="0.1.0",
    description="fairseq plugin for very deep Transformers: DeepNorm (DeepNet) and Pre-LN, "
    "stability diagnostics and paper setups",
    # the plugin (--user-dir deepnet_fairseq) on the text pipeline and the method registry, the paper setups above
    # it, the drivers on top
    packages=find_packages(include=["deepnet_fairseq", "deepnet_fairseq.*", "deepnet_text", "deepnet_methods",
                                    "deepnet_setups", "deepnet_experiments"]),
    python_requires=">=3.10",
    # Dependencies are installed by scripts/install.sh from requirements.txt (fairseq-fixed must
    # be built after torch with --no-build-isolation, which pip's resolver cannot express).
    install_requires=[],
)
