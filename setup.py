"""Builds perfsdk's one C extension, ``perfsdk._native`` (the hot path and the step core).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no
compiler, an unusual platform) the install still succeeds and perfsdk runs the same algorithms in
Python (``perfsdk.Monitor(...).hot_path == "python"``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "perfsdk._native",
            sources=[
                "perfsdk/csrc/module.c",
                "perfsdk/csrc/records.c",
                "perfsdk/csrc/stepcore.c",
                "perfsdk/csrc/hotpath.c",
            ],
            depends=["perfsdk/csrc/native.h"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
            extra_link_args=["-pthread"],
        )
    ]
)
