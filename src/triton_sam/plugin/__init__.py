"""The napari layer of triton-sam: everything that imports napari or Qt lives here."""
