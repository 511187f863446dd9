// Being written: see the header of the same name.
