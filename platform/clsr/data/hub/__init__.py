"""The Hugging Face hub: which sources the built-in loaders may ask for, reaching it (or going offline), resolving
model names, and reading a sentence-transformers folder's own modules."""
