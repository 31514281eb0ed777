"""Make minion key pairs with Salt's own key generator (what `salt-key --gen-keys` calls),
many per interpreter start: one `salt-key --gen-keys` process per key costs about 1.5 s.

Usage: <venv>/bin/python tests/salt/gen-keys.py DIR PREFIX COUNT
Writes DIR/<PREFIX><NNN>.pem and .pub (NNN zero-padded from 0), then prints how many.
"""
import sys

import salt.crypt

out_dir, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Salt 3008 moved the file-writing generator to write_keys(); 3006 calls it gen_keys().
write = getattr(salt.crypt, "write_keys", None) or salt.crypt.gen_keys
width = len(str(count - 1))
for n in range(count):
    name = f"{prefix}{n:0{width}d}"
    write(out_dir, name, 2048)

print(f"{count} key pairs in {out_dir}")
