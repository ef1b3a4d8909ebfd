"""The mapping step of ``assert_same_training`` and ``assert_resumes``: the ranks' records in the
reference's names and shapes, with the groups found (``mapping.map_sides``)."""
