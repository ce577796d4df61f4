"""The shipped algorithm libraries, as the package ``taccl_py.data.algorithms`` (see pyproject.toml).

This file exists because setuptools' editable installs only map a folder that is a package.
"""
