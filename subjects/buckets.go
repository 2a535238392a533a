package subjects

// BucketSettings holds the cluster's security settings: the first worker
// records them, and every later one must match them to start.
const BucketSettings = "toolgate_settings"

// BucketModels holds the model catalogue: one entry per model, by name
// (toolgate models register).
const BucketModels = "toolgate_models"
