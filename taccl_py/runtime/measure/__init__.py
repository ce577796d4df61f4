"""Measuring the runtime and the machine: ``taccl bench`` (``bench``), ``taccl profile`` (``profile``), and the
simulator's prediction beside each measured row (``profile_model``).
"""
