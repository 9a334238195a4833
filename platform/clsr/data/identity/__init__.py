"""A trial's data identities: what each source was and a hash of the rows read (``digest``), and where
each built-in set comes from (``sources``)."""
