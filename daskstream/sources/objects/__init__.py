"""Object stores (S3, GCS, Azure, HTTP, memory): places on them and the requests that read them."""
