//! Kubernetes' name rules (k8s.io/apimachinery `pkg/util/validation`) as the validator and
//! the operator apply them.

use dynamo_crds::common::NameRule;

fn refused(rule: NameRule, value: &str) -> String {
    match rule.check(value) {
        Ok(()) => panic!("{value:?} passed as a {}", rule.name()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn dns1123_subdomain_as_custom_resource_names() {
    let rule = NameRule::Dns1123Subdomain;
    for good in ["a", "my-graph", "my.graph.v2", "0abc", &"a".repeat(253)] {
        assert_eq!(rule.check(good), Ok(()), "{good}");
    }
    assert!(refused(rule, "MyGraph_X").ends_with(
        "is not a valid DNS-1123 subdomain: it contains 'M' (at most 253 lower-case letters, digits, '-' and '.', each part between dots starting and ending with a letter or digit)"
    ));
    assert!(refused(rule, &"a".repeat(254)).contains("it has 254 characters"));
    assert!(
        refused(rule, "a\0b")
            .starts_with(r#""a\0b" is not a valid DNS-1123 subdomain: it contains '\0'"#)
    );
    assert!(refused(rule, "").contains("it is empty"));
    assert!(refused(rule, "-a").contains("it starts with '-'"));
    assert!(refused(rule, "a.").contains("it ends with '.'"));
    for dots in ["a..b", "a-.b", "a.-b"] {
        assert!(
            refused(rule, dots).contains("a '.' is next to another '.' or a '-'"),
            "{dots}"
        );
    }
}

#[test]
fn long_values_are_cut_in_messages() {
    let long = format!("{}{}", "a".repeat(276), "-99999-wkr-1".repeat(2));
    let message = refused(NameRule::Dns1123Subdomain, &long);
    assert!(
        message.starts_with(&format!(
            "\"{}\"...\"-99999-wkr-1-99999-wkr-1\" (300 characters) is not",
            "a".repeat(64)
        )),
        "{message}"
    );
    // Up to 96 characters are shown whole.
    let shown = "b".repeat(96);
    assert!(refused(NameRule::Dns1123Label, &shown).starts_with(&format!("\"{shown}\" is not")));
}

#[test]
fn labels_allow_63_characters() {
    for rule in [NameRule::Dns1123Label, NameRule::Dns1035Label] {
        assert_eq!(rule.check(&"a".repeat(63)), Ok(()));
        assert!(refused(rule, &"a".repeat(64)).contains("it has 64 characters"));
        assert!(refused(rule, "a.b").contains("it contains '.'"));
        assert!(refused(rule, "a-").contains("it ends with '-'"));
    }
    // Service names (DNS-1035) must start with a letter; DNS-1123 labels need not.
    assert_eq!(NameRule::Dns1123Label.check("1graph"), Ok(()));
    assert!(refused(NameRule::Dns1035Label, "1graph").contains("it starts with '1'"));
}

#[test]
fn label_values_and_keys() {
    let value = NameRule::LabelValue;
    for good in ["", "VllmWorker", "a_b.c-d", &"x".repeat(63)] {
        assert_eq!(value.check(good), Ok(()), "{good}");
    }
    assert!(refused(value, &"x".repeat(64)).contains("it has 64 characters"));
    assert!(refused(value, "_a").contains("it starts with '_'"));
    assert!(refused(value, "a b").contains("it contains ' '"));

    let key = NameRule::QualifiedName;
    for good in ["app", "nvidia.com/dynamo-role", "Team_Name", "a/B"] {
        assert_eq!(key.check(good), Ok(()), "{good}");
    }
    assert!(refused(key, "").contains("it is empty"));
    assert!(
        refused(key, "Nvidia.com/role")
            .contains("its prefix \"Nvidia.com\" is not a DNS-1123 subdomain: it contains 'N'")
    );
    assert!(refused(key, "nvidia.com/").contains("its name part \"\": it is empty"));
    assert!(refused(key, "a/b/c").contains("its name part \"b/c\": it contains '/'"));
    assert!(refused(key, &"k".repeat(64)).contains("it has 64 characters"));
}
