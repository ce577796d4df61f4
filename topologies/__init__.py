"""The built-in machine files, as the package ``taccl_py.data.topologies`` (see pyproject.toml).

This file exists because setuptools' editable installs only map a folder that is a package.
"""
