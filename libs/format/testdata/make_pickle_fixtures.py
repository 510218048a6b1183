"""Writes pickles of one reference object at every protocol, for pickle_reader_test.

Usage: make_pickle_fixtures.py OUT_DIR
Writes OUT_DIR/reference_p{0..5}.pkl and OUT_DIR/objects_p{0..5}.pkl (user classes that the
reader must keep as opaque data without importing them).
"""
import collections
import pickle
import sys


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y


class Tagged(dict):
    pass


class Items(list):
    pass


class WithKwargs:
    def __new__(cls, *, size):
        obj = super().__new__(cls)
        obj.size = size
        return obj

    def __getnewargs_ex__(self):
        return (), {'size': self.size}


def reference():
    shared = [1, 2]
    return {
        'none': None,
        'true': True,
        'false': False,
        'ints': [0, 1, 255, 256, 65535, 65536, -1, -129, 2**31 - 1, -2**31, 2**31,
                 2**63 - 1, -2**63],
        'big': [2**64, -2**64 - 5, 10**30],
        'floats': [0.0, 1.5, -2.25, 1e300, float('inf')],
        'str': ['', 'plain', 'h\u00e9llo w\u00f6rld \u2713', 'quote\'s "double" \\ back\nnewline',
                '\U0001F600'],
        'bytes': [b'', b'\x00\x01\xff', bytes(range(256))],
        'bytearray': bytearray(b'ab\x00\xff'),
        'tuples': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        'int_keys': {0: 'zero', 7: 'seven', -3: 'neg'},
        'ordered': collections.OrderedDict([('b', 1), ('a', 2)]),
        'set': {3},
        'frozenset': frozenset({4}),
        'shared': (shared, shared),
        'nested': {'a': {'b': {'c': [[]]}}},
        'tuple_keys': {(1, 2): 'x'},
        'complex': 1 + 2j,
    }


def objects():
    tagged = Tagged()
    tagged['k'] = 1
    tagged.note = 'hi'
    items = Items([5, 6])
    return [Point(1, 'two'), tagged, items]


def main():
    out = sys.argv[1]
    for protocol in range(6):
        with open(f'{out}/reference_p{protocol}.pkl', 'wb') as f:
            pickle.dump(reference(), f, protocol=protocol)
        with open(f'{out}/objects_p{protocol}.pkl', 'wb') as f:
            pickle.dump(objects(), f, protocol=protocol)
    # Bigger than the reader's 64 KiB buffer: long lines, long strings, many small opcodes.
    big = ['x' * 100000] + [f's{i}' for i in range(20000)]
    for protocol in (0, 2):
        with open(f'{out}/big_p{protocol}.pkl', 'wb') as f:
            pickle.dump(big, f, protocol=protocol)
    with open(f'{out}/kwargs_p4.pkl', 'wb') as f:
        pickle.dump(WithKwargs(size=3), f, protocol=4)


if __name__ == '__main__':
    main()
