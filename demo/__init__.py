"""SpecLens: watch EAGLE / EAGLE-3 speculative decoding happen, one verification step at a time."""
