"""The car's side of the loop: what runs in the vehicle before data enters the upload path."""
