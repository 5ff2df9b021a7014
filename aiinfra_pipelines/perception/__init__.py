"""The car-side perception contract: network, labels, tensors in and out, engine interface.

It sits beside ``logs/`` as shared vocabulary rather than inside ``training/`` because every
layer speaks it — the fleet drives with the released engine, mining runs it over new frames,
training fits it, deployment exports and quantizes it, simulation closes the loop with it — and
assets may import only from layers before their own.
"""
