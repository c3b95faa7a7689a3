//! The gateway load balancer's choice (`quicsni::pick`): only endpoints of the connection's SNI, healthy ones.

use quicsni::pick::Endpoints;

fn endpoints() -> Endpoints {
    Endpoints::new([
        ("10.0.0.1:18008", "8080.web.default.mesh.local"),
        ("10.0.0.2:18008", "8080.web.default.mesh.local"),
        ("10.0.0.3:18008", "9090.api.default.mesh.local"),
        // One pod serving two SNIs (two ports of one ServiceAccount), as the translator writes it and as two hosts.
        (
            "10.0.0.4:18008",
            "9090.api.default.mesh.local,7070.API.default.mesh.local",
        ),
        ("10.0.0.5:18008", "6060.api.default.mesh.local"),
        ("10.0.0.5:18008", "5050.api.default.mesh.local"),
    ])
}

#[test]
fn an_sni_gets_only_its_own_endpoints_in_turn() {
    let e = endpoints();
    let healthy = ["10.0.0.1:18008", "10.0.0.2:18008", "10.0.0.3:18008", "10.0.0.4:18008"];
    let web: Vec<_> = (0..4)
        .map(|t| e.pick("8080.web.default.mesh.local", healthy, t))
        .collect();
    assert_eq!(web, [Some(0), Some(1), Some(0), Some(1)]);
    let api: Vec<_> = (0..2)
        .map(|t| e.pick("9090.api.default.mesh.local", healthy, t))
        .collect();
    assert_eq!(api, [Some(2), Some(3)]);
    assert_eq!(e.pick("7070.api.default.mesh.local", healthy, 5), Some(3));
    let five = ["10.0.0.5:18008"];
    assert_eq!(e.pick("5050.api.default.mesh.local", five, 0), Some(0));
    assert_eq!(e.pick("6060.api.default.mesh.local", five, 0), Some(0));
}

#[test]
fn no_healthy_endpoint_of_the_sni_is_none_never_another_services() {
    let e = endpoints();
    assert_eq!(e.pick("8080.web.default.mesh.local", ["10.0.0.3:18008"], 0), None);
    assert_eq!(e.pick("other.default.mesh.local", ["10.0.0.1:18008"], 0), None);
    assert_eq!(
        Endpoints::new::<&str, &str>([]).pick("8080.web.default.mesh.local", ["10.0.0.1:18008"], 0),
        None
    );
}
