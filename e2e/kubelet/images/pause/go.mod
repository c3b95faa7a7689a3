module aether.dev/spike/pause

go 1.22
