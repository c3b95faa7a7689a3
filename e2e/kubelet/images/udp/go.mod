module aether.dev/spike/udp

go 1.22
