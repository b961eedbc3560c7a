"""Triton kernels of the forwards, each row computed alike at any width."""
